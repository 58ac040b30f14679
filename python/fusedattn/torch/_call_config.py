"""A call's options as the core's Config (fusedattn/_config.py): printed once per option set, which is
how the operators carry them (compiled programs get the text as a constant and may outlive this
process), and parsed back, with the bias kind of the call's bias, into the spec a body runs."""
import functools

import torch

from .. import _config
from ._tensors import view


@torch.compiler.assume_constant_result  # compiled code gets the text as a constant at trace time
def config_text(*, layout, kv_layout="", causal=False, window=(-1, -1), align="top_left", bias_grad=False,
                alibi=False, softmax="vanilla", dropout=0.0, deterministic=False, padding=False, max_logit="",
                stats=True, kv_pages=0, score_mod="", fp8_scaling=""):
    """A call's config in its printed form, without a bias kind (the bodies take it from the bias's
    shape: call_spec). The options and their defaults are _config.config's."""
    return _printed(layout, kv_layout, causal, window, align, bias_grad, alibi, softmax, dropout, deterministic,
                    padding, max_logit, stats, kv_pages, score_mod, fp8_scaling)


@torch.compiler.assume_constant_result
def fp8_config_text(*, layout, causal, window, align, fp8_grads, padding=False):
    """fp8_attention's config in its printed form; fp8_grads: "e5m2" for the hybrid format's FP8
    backward, else "" (_fp8_recipe.fp8_grads); padding: runtime lengths (seq_len_q, seq_len_kv)."""
    return _printed_fp8(layout, causal, window, align, fp8_grads, padding)


# Printed once per option set, not on every eager call. Keyed on positional arguments, which this
# module's own calls pass in their parameters' order: lru_cache's cheapest key.
@functools.lru_cache(maxsize=4096)
def _printed(layout, kv_layout, causal, window, align, bias_grad, alibi, softmax, dropout, deterministic, padding,
             max_logit, stats, kv_pages, score_mod, fp8_scaling):
    return str(_config.config(layout, kv_layout, causal=causal, window=window, align=align, bias_grad=bias_grad,
                              alibi=alibi, softmax=softmax, dropout=dropout, deterministic=deterministic,
                              padding=padding, max_logit=max_logit, stats=stats, kv_pages=kv_pages,
                              score_mod=score_mod, fp8_scaling=fp8_scaling))


@functools.lru_cache(maxsize=4096)
def _printed_fp8(layout, causal, window, align, fp8_grads, padding):
    return str(_config.config(layout, causal=causal, window=window, align=align, fp8_grads=fp8_grads,
                              padding=padding))


# Road 1's key (fusedattn.torch's C++ path): positional arguments are lru_cache's cheapest key, and a
# call with these as keywords costs about 0.18 µs more (measured on the development CPU), on a road
# whose whole Python share is a few µs.
@functools.lru_cache(maxsize=4096)
def plain_config_id(layout, causal, window, align, alibi, softmax, deterministic, score_mod=""):
    """The registered id of a plain call's config, for the C++ path: one lookup per call (a keyword
    call into the config's own cache costs twice as much). `score_mod`: a traced expression whose
    only runtime values are its scalars, or ""."""
    return _config.config(layout, causal=causal, window=window, align=align, alibi=alibi, softmax=softmax,
                          deterministic=deterministic, score_mod=score_mod).id


def call_spec(q, k, v, *, bias, extras, config, max_seqlen_q, max_seqlen_kv):
    """(Config, spec) that a body runs for these tensors: the printed `config`, with the bias kind
    of `bias`'s shape where there is one; the tensors a score modifier captured, a call's lengths
    and a paged call's tables, and an FP8 cache's descales are checked against the spec. Raises
    the core's errors for bad input."""
    parsed = _config.parse(config)
    sequences = extras.sequences()
    if bias is not None:
        parsed = parsed.with_bias(view(bias), view(q), view(k), sequences, max_seqlen_q, max_seqlen_kv)
    spec = parsed.spec(view(q), view(k), view(v), sequences, max_seqlen_q, max_seqlen_kv)
    extras.check_score_mod_tensors(spec)
    extras.check_lengths_and_tables(spec)
    extras.check_fp8_cache_descales(spec, parsed.fp8_scaling)
    return parsed, spec
