"""The one configuration object of a call, shared by fusedattn.torch and fusedattn.jax: the
adapters' keyword arguments as a frozen core Config (fusedattn/call.h). The core parses and checks
every option, with the same messages as the spec string's parser, and builds each call's spec from
it (Config.spec); no adapter writes spec text or validation of its own. Framework-free."""
import functools

from . import _core as core
from .errors import invalid_argument

FORWARD, BACKWARD = core.Pass.forward, core.Pass.backward

# Per dense layout, the array axis that holds each logical axis (batch, heads, sequence, head dim),
# from the core's one table (call.h's axes_of): for the axes vmap folds, a mesh splits, and the
# fallback permutes.
AXES = core.dense_axes()


@functools.lru_cache(maxsize=4096)  # configs, not plans: a program uses a handful of option sets
def config(layout="bshd", kv_layout="", *, causal=False, window=(-1, -1), align="top_left", bias="none",
           bias_grad=False, alibi=False, softmax="vanilla", dropout=0.0, deterministic=False, padding=False,
           max_logit="", stats=True, kv_pages=0, score_mod="", fp8_grads="", fp8_scaling=""):
    """The frozen Config of a call's options. `window` is (left, right), -1 open; `causal` closes it
    on the right; `bias` is a bias kind (core.Config.bias_kind gives it from a bias's shape);
    `padding` makes the lengths runtime data; `max_logit` is "", "row" or "head"; `score_mod` is a
    modifier's expression text (_score_mod.py traces it from a function); `fp8_grads` is "e5m2" for an
    FP8 backward with E5M2 gradients beside E4M3 inputs (_fp8_recipe.py's hybrid format);
    `fp8_scaling` is "" (the core's default) or "head" for an FP8 K/V cache's descales of one a
    K/V head (_fp8_cache.py)."""
    extra = {"score_mod": score_mod} if score_mod else {}
    if fp8_grads:
        extra["fp8_grads"] = fp8_grads
    if fp8_scaling:
        extra["fp8_scaling"] = fp8_scaling
    return core.Config(layout, kv_layout, causal=causal, window=window, align=align, bias=bias, bias_grad=bias_grad,
                       alibi=alibi, softmax=softmax, dropout=float(dropout), deterministic=deterministic,
                       padding=padding, max_logit=max_logit or "none", stats=stats, kv_pages=kv_pages, **extra)


@functools.lru_cache(maxsize=4096)
def parse(text):
    """The Config that str(config) printed (compiled programs carry configs as this text)."""
    return core.Config.parse(text)


def require_arrays(ragged, *, sink, softmax, seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                   max_seqlen_kv):
    """What the core cannot see, since it never reaches a spec: which of a call's optional arrays
    came, and with what. Both adapters ask here, so the checks and their words are the same."""
    if (seq_len_q is None) != (seq_len_kv is None):
        raise invalid_argument("seq_len_q", "given" if seq_len_q is not None else None,
                               "seq_len_q and seq_len_kv together")
    if ragged and (cu_seqlens_q is None or cu_seqlens_kv is None or max_seqlen_q <= 0 or max_seqlen_kv <= 0):
        raise invalid_argument("cu_seqlens_q", cu_seqlens_q,
                               "cu_seqlens_q, cu_seqlens_kv (int32 [n + 1]) and max_seqlen_q, max_seqlen_kv with thd")
    if not ragged and (cu_seqlens_q is not None or cu_seqlens_kv is not None):
        raise invalid_argument("cu_seqlens_q", "given", "layout='thd' (packed sequences)")
    if ragged and seq_len_q is not None:
        raise invalid_argument("seq_len_q", "given", "a dense layout (thd's lengths are its cu_seqlens)")
    if (softmax == "sink") != (sink is not None):
        raise invalid_argument("sink", "given" if sink is not None else None, "a sink exactly when softmax='sink'")


def dtype_name(array):
    """An array's dtype as both frameworks' arrays spell it: "int32", "float8_e4m3fn"."""
    return str(array.dtype).removeprefix("torch.")


def dims(shape):
    """A shape as the core's messages write one: [4,32]."""
    return "[" + ",".join(str(n) for n in shape) + "]"


def page_count(page_table_k):
    """The pages each sequence of a paged call has: its page table's second axis (the config's
    kv_pages)."""
    shape = tuple(page_table_k.shape)
    if len(shape) != 2 or shape[1] < 1:
        raise invalid_argument("page_table_k.shape", dims(shape), "[b, pages a sequence], at least one page")
    return shape[1]


def require_paged_arrays(spec, *, page_table_k, page_table_v, seq_len_kv, seq_len_q=None):
    """What the core cannot see of a paged call, since it reads them by address: int32 page tables
    of a row for each of the spec's sequences, and lengths of one entry each (seq_len_q where given).
    Both adapters ask here, after the core validated the spec."""
    batch, pages = spec.batch, page_table_k.shape[1]
    table = f"[{batch},{pages}]: a row of {pages} pages (as page_table_k has) for each of the query's {batch} sequences"
    _require_int32((("page_table_k", page_table_k, (batch, pages), table),
                    ("page_table_v", page_table_v, (batch, pages), table)) + _lengths(batch, seq_len_q, seq_len_kv))


def require_lengths(spec, *, seq_len_q, seq_len_kv):
    """What the core cannot see of a dense call's runtime lengths, since it reads them by address:
    int32, one entry for each of the spec's sequences. Both adapters ask here, after the core
    validated the spec."""
    _require_int32(_lengths(spec.batch, seq_len_q, seq_len_kv))


def _lengths(batch, seq_len_q, seq_len_kv):
    lengths = f"[{batch}]: one length for each of the query's {batch} sequences"
    return ("seq_len_kv", seq_len_kv, (batch,), lengths), ("seq_len_q", seq_len_q, (batch,), lengths)


def _require_int32(arrays):
    """(name, array or None, shape, requirement) each: an array of that shape in int32."""
    for name, array, shape, requirement in arrays:
        if array is None:
            continue
        if tuple(array.shape) != shape:
            raise invalid_argument(f"{name}.shape", dims(array.shape), requirement)
        dtype = dtype_name(array)
        if dtype != "int32":
            raise invalid_argument(f"{name}.dtype", dtype, "int32")


@functools.lru_cache(maxsize=4096)
def _output_axes(config, pass_):
    return config.output_axes(pass_)


def output_shapes(config, pass_, q, k, v):
    """Each output of the pass by name (o, stats, max_logit; d_q, d_k, d_v, d_sink: those the config
    has) and its sizes in the caller's axis order, for the adapters to allocate. The core says which
    axis of q, k or v each output axis takes (fusedattn/output_shapes.h); taking the sizes here, from
    any array with a .shape, keeps torch.compile's symbolic sizes symbolic (so the fake
    implementations use this too) and JAX's tracers' shapes as they are."""
    inputs = {"q": q, "k": k, "v": v}
    return {name: tuple(inputs[tensor].shape[axis] for tensor, axis in picks)
            for name, picks in _output_axes(config, pass_).items()}
