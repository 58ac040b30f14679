"""The one configuration object of a call, shared by fusedattn.torch and fusedattn.jax: the
adapters' keyword arguments as a frozen core Config (fusedattn/call.h). The core parses and checks
every option, with the same messages as the spec string's parser, and builds each call's spec from
it (Config.spec); no adapter writes spec text or validation of its own. Framework-free."""
import functools

from . import _core as core

FORWARD, BACKWARD = core.Pass.forward, core.Pass.backward


@functools.lru_cache(maxsize=4096)  # configs, not plans: a program uses a handful of option sets
def config(layout="bshd", kv_layout="", *, causal=False, window=(-1, -1), align="top_left", bias="none",
           bias_grad=False, alibi=False, softmax="vanilla", dropout=0.0, deterministic=False, padding=False,
           max_logit="", stats=True, kv_pages=0):
    """The frozen Config of a call's options. `window` is (left, right), -1 open; `causal` closes it
    on the right; `bias` is a bias kind (core.Config.bias_kind gives it from a bias's shape);
    `padding` makes the lengths runtime data; `max_logit` is "", "row" or "head"."""
    return core.Config(layout, kv_layout, causal=causal, window=window, align=align, bias=bias, bias_grad=bias_grad,
                       alibi=alibi, softmax=softmax, dropout=float(dropout), deterministic=deterministic,
                       padding=padding, max_logit=max_logit or "none", stats=stats, kv_pages=kv_pages)


@functools.lru_cache(maxsize=4096)
def parse(text):
    """The Config that str(config) printed (compiled programs carry configs as this text)."""
    return core.Config.parse(text)
