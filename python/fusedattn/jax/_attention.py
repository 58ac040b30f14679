"""fusedattn.jax.attention: a call's keyword arguments as the core Configs of its forward (no
statistics) and of training, its optional arrays as the calls' operands, and the differentiable
call (_attention_vjp) over them."""
import dataclasses
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from .. import _config
from ..errors import invalid_argument
from . import _score_mod
from ._attention_vjp import differentiable_attention
from ._calls import as_int32, traced_call, view


def _dropout_rng(key):
    """Dropout's Philox seed and offset, as uint32[4] (two int64, low word first): a 63-bit seed
    drawn from the key, offset 0. The same key gives the same mask, in the backward too."""
    words = jax.random.bits(key, (2,), jnp.uint32)
    return jnp.concatenate([words.at[1].set(words[1] & jnp.uint32(0x7FFFFFFF)), jnp.zeros(2, jnp.uint32)])


def attention(q, k, v, *, layout: str = "bshd", causal: bool = False, align: str = "top_left",
              window: Tuple[int, int] = (-1, -1), scale: Optional[float] = None, bias=None, bias_grad: bool = True,
              alibi: bool = False, softmax: str = "vanilla", sink=None, dropout_rate: float = 0.0,
              dropout_key=None, deterministic: bool = False, seq_len_q=None, seq_len_kv=None,
              cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q: int = 0, max_seqlen_kv: int = 0,
              return_max_logit: str = "", score_mod=None, mask_mod=None):
    """Fused attention of q, k, v in `layout`: "bshd" (JAX's usual [batch, seq, heads, dim]),
    "sbhd", "bhsd", or "thd" for packed sequences ([tokens, heads, dim] with cu_seqlens_q and
    cu_seqlens_kv, int32 [n + 1] cumulative offsets, and max_seqlen_q / max_seqlen_kv, the
    longest sequences, as Python ints). Returns O in q's layout.

    causal / window (left, right; -1 open) and align ("top_left" or "bottom_right") place the
    mask. GQA/MQA: fewer K/V heads dividing the query heads. bias: a post-scale bias
    [b|1, h|1, s_q|1, s_kv], differentiated unless bias_grad=False (then its cotangent is zero).
    alibi adds ALiBi (with a causal window). softmax: "vanilla", "off_by_one", or "sink" with
    `sink`, float32 [h_q], learnable. dropout_rate > 0 drops attention probabilities with a mask
    drawn from dropout_key (a JAX PRNG key): the same key gives the same mask, in the backward and
    on a later call. deterministic: a bitwise-reproducible backward. seq_len_q / seq_len_kv (int32
    [b], together) make each entry's lengths runtime data: O and the gradients are zero past them.
    return_max_logit="row" or "head" also returns the max logit (float32 [b, h_q, s_q] or [h_q];
    [t, h_q] by token for thd), not differentiated: (O, max_logit).
    score_mod: a function (score, b, h, q_idx, kv_idx) -> score written with jax.numpy, applied to
    each scaled score before the masks (FlexAttention's score_mod), traced by JAX into the core's
    expression: numbers become runtime scalars, arrays it captures and indexes by b, h, q_idx,
    kv_idx are read at each call, terms added to the score that gather from an array or read one
    under differentiation run as a bias (with its gradient), and a primitive the expressions lack
    raises NotSupportedError. mask_mod: FlexAttention's mask function (b, h, q_idx, kv_idx) -> bool,
    traced the same way: keys it drops get -inf after score_mod.

    Errors raise fusedattn.errors classes while tracing, worded by the core as for every adapter;
    where the tracing process has a GPU, an unsupported configuration raises NotSupportedError
    with every reason.
    """
    ragged = layout == "thd"
    _require_arrays(ragged=ragged, sink=sink, softmax=softmax, dropout_rate=dropout_rate, dropout_key=dropout_key,
                    seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, cu_seqlens_q=cu_seqlens_q,
                    cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)
    if mask_mod is not None and not causal and tuple(window) == (-1, -1):
        band = _score_mod.mask_band(mask_mod)
        if band is not None:  # cuDNN's own band mask (fusedattn/_mask_structure.py), which skips what it drops
            window, mask_mod = (band, 0), None
    if mask_mod is not None:
        mod, stopped = _score_mod.trace_masked(score_mod, mask_mod)
    else:
        mod, stopped = _score_mod.trace(score_mod) if score_mod is not None else (None, ())
    if mod is not None and mod.bias is not None:
        bias, bias_grad = _score_mod.with_modifier_bias(mod, q, k, layout=layout, stopped=stopped, bias=bias,
                                                        bias_grad=bias_grad)
    # A forward nobody differentiates writes no statistics; training's forward and backward share the other.
    configs = [_config.config(layout, causal=causal, window=tuple(window), align=align,
                              bias_grad=bias is not None and bias_grad, alibi=alibi, softmax=softmax,
                              dropout=dropout_rate, deterministic=deterministic,
                              padding=ragged or seq_len_q is not None, max_logit=return_max_logit, stats=stats,
                              score_mod=mod.text if mod is not None else "")
               for stats in (False, True)]
    sequences = cu_seqlens_q.shape[0] - 1 if ragged else 0
    if bias is not None:  # the core names the bias kind of its shape
        configs = [config.with_bias(view(bias), view(q), view(k), sequences, max_seqlen_q, max_seqlen_kv)
                   for config in configs]
    inference, spec = traced_call(configs[0], q, k, v, scale=scale, max_seqlen=(max_seqlen_q, max_seqlen_kv),
                                  sequences=sequences)
    lengths = tuple(map(as_int32, (seq_len_q, seq_len_kv))) if seq_len_q is not None else ()
    if lengths:  # what the handlers read by address: one each of the spec's sequences
        _config.require_lengths(spec, seq_len_q=lengths[0], seq_len_kv=lengths[1])
    training = dataclasses.replace(inference, config=configs[1])
    o, max_logit = differentiable_attention(
        (inference, training), (spec.heads_q, spec.heads_kv), q, k, v, bias=bias,
        sink=None if sink is None else jnp.asarray(sink, jnp.float32),
        rng=_dropout_rng(dropout_key) if inference.config.dropout > 0.0 else None,
        lengths=lengths,
        offsets=tuple(map(as_int32, (cu_seqlens_q, cu_seqlens_kv))) if ragged else (),
        mods=_score_mod.operands(mod, spec, stopped=stopped))
    return (o, max_logit) if max_logit is not None else o


def _require_arrays(*, ragged, sink, softmax, dropout_rate, dropout_key, seq_len_q, seq_len_kv, cu_seqlens_q,
                    cu_seqlens_kv, max_seqlen_q, max_seqlen_kv):
    """What the core cannot see: which of the API's optional arrays came (_config.require_arrays,
    shared with fusedattn.torch), and a key for dropout."""
    _config.require_arrays(ragged=ragged, sink=sink, softmax=softmax, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                           cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                           max_seqlen_kv=max_seqlen_kv)
    if dropout_rate > 0.0 and dropout_key is None:
        raise invalid_argument("dropout_key", None, "a JAX PRNG key when dropout_rate > 0")
