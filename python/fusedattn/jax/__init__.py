"""fusedattn.jax — the JAX adapter: XLA FFI custom calls into the same core.

    from fusedattn.jax import attention
    out = attention(q, k, v, causal=True)     # [batch, seq, heads, dim], like jax.nn.dot_product_attention

It only translates: a call's keyword arguments become one frozen core Config (fusedattn/_config.py,
shared with fusedattn.torch), and the core builds and validates the spec from it and the arrays'
shapes while tracing. The spec travels, printed by the core, as the custom call's attribute;
XLA's INSTANTIATE stage parses it, the INITIALIZE stage before each execution makes sure the plan
for that device exists (built once), and the execute stage only enqueues it on XLA's stream, with
a workspace XLA planned as one of the call's results, so it is safe for command buffers.

Differentiable (jax.custom_vjp over the core's backward); works under jit, grad, jax.checkpoint
and vmap (_jax_batching: the mapped axis joins the batch where it can). Under a mesh with q, k, v
sharded over batch and heads, each device calls on its own shard and nothing is gathered
(_jax_partition).
"""
import dataclasses
import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from .. import _config
from . import _batching, _calls, _partition, _score_mod
from ._calls import BACKWARD, FORWARD, Call, view
from ..errors import NotSupportedError, invalid_argument

__all__ = ["attention", "paged_attention", "Fp8State", "fp8_state", "fp8_attention", "context_parallel_attention",
           "load_balance", "unbalance"]

# The kernel behind each pass; tests put plain-JAX references here to check batching and
# partitioning without a GPU.
_KERNELS = {pass_: functools.partial(_calls.run, pass_) for pass_ in (FORWARD, BACKWARD)}


def _kernel(pass_):
    return _KERNELS[pass_]


@functools.lru_cache(maxsize=None)
def _call(pass_, call, heads):
    """The `pass_` of `call` on arrays with (h_q, h_kv) heads: a function of arrays alone, with its
    vmap rule and its partitioning."""
    return _batching.with_batching(_partition.partitioned(_kernel, pass_, call, *heads), pass_, call)


def _traced(config, scale, max_seqlen, q, k, v, sequences):
    """The Call of `config` on these arrays, and its spec on them: the core validates the whole
    call here, while tracing, in the words it uses for every adapter."""
    max_seqlen = (int(max_seqlen[0]), int(max_seqlen[1]))
    spec = config.spec(view(q), view(k), view(v), sequences, *max_seqlen)
    return Call(config, spec.default_scale if scale is None else float(scale), max_seqlen), spec


def _present(*arrays):
    return tuple(x for x in arrays if x is not None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attention(calls, heads, q, k, v, bias, sink, rng, lengths, offsets, mods):
    """O, and the max logit where asked for (else None). `calls`: the Call of a forward nobody
    differentiates (no statistics) and the Call the forward and backward of training share.
    `mods`: a score modifier's scalars and tensors (not differentiated)."""
    out = _call(FORWARD, calls[0], heads)(q, k, v, *_present(bias, sink, rng, *lengths, *offsets, *mods))
    return tuple(out) if calls[0].config.max_logit != "none" else (out, None)


def _attention_fwd(calls, heads, q, k, v, bias, sink, rng, lengths, offsets, mods):
    o, stats, *max_logit = _call(FORWARD, calls[1], heads)(q, k, v,
                                                           *_present(bias, sink, rng, *lengths, *offsets, *mods))
    return (o, max_logit[0] if max_logit else None), (q, k, v, o, stats, bias, sink, rng, lengths, offsets, mods)


def _attention_bwd(calls, heads, residuals, cotangents):
    d_o, _ = cotangents  # the max logit is not differentiated
    q, k, v, o, stats, bias, sink, rng, lengths, offsets, mods = residuals
    grads = _call(BACKWARD, calls[1], heads)(q, k, v, o, stats, d_o.astype(o.dtype),
                                            *_present(bias, sink, rng, *lengths, *offsets, *mods))
    d_q, d_k, d_v, *rest = grads
    d_bias = rest.pop(0) if calls[1].config.bias_grad else (None if bias is None else jnp.zeros_like(bias))
    d_sink = rest.pop(0) if sink is not None else None

    def no_gradient(x):  # integer inputs (dropout's rng, lengths, offsets) take float0 cotangents
        return None if x is None else jnp.zeros(x.shape, jax.dtypes.float0)
    return (d_q, d_k, d_v, d_bias, d_sink, no_gradient(rng), tuple(map(no_gradient, lengths)),
            tuple(map(no_gradient, offsets)), tuple(jnp.zeros_like(x) for x in mods))


_attention.defvjp(_attention_fwd, _attention_bwd)


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
              return_max_logit: str = "", score_mod=None):
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
    kv_idx are read at each call (not differentiated: a captured array under differentiation
    raises NotSupportedError), and a primitive the expressions lack raises NotSupportedError.

    Errors raise fusedattn.errors classes while tracing, worded by the core as for every adapter;
    where the tracing process has a GPU, an unsupported configuration raises NotSupportedError
    with every reason.
    """
    ragged = layout == "thd"
    _require_arrays(ragged, sink, softmax, dropout_rate, dropout_key, seq_len_q, seq_len_kv, cu_seqlens_q,
                    cu_seqlens_kv, max_seqlen_q, max_seqlen_kv)
    mod, stopped = _score_mod.trace(score_mod) if score_mod is not None else (None, ())
    if mod is not None and mod.bias is not None:  # its gathered or learned terms, added to the score as a bias
        mod_bias, learned = _score_mod.dense_bias(mod.bias, q, k, layout, stopped)
        mod_bias = mod_bias if learned else jax.lax.stop_gradient(mod_bias)
        given_grad = bias is not None and bias_grad
        if bias is not None and not bias_grad:
            bias = jax.lax.stop_gradient(bias)
        bias, bias_grad = (mod_bias if bias is None else bias + mod_bias), given_grad or learned
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
    inference, spec = _traced(configs[0], scale, (max_seqlen_q, max_seqlen_kv), q, k, v, sequences)
    training = dataclasses.replace(inference, config=configs[1])
    rng = _dropout_rng(dropout_key) if inference.config.dropout > 0.0 else None
    lengths = tuple(map(_int32, (seq_len_q, seq_len_kv))) if seq_len_q is not None else ()
    offsets = tuple(map(_int32, (cu_seqlens_q, cu_seqlens_kv))) if ragged else ()
    mods = _score_mod_arrays(mod, stopped, spec)
    o, max_logit = _attention((inference, training), (spec.heads_q, spec.heads_kv), q, k, v, bias,
                              None if sink is None else jnp.asarray(sink, jnp.float32), rng, lengths, offsets, mods)
    return (o, max_logit) if max_logit is not None else o


def _score_mod_arrays(mod, stopped, spec):
    """A traced modifier's operands: its scalars (float32 [n]) and its captured arrays (float32),
    each of the shape its indices span in this call, not differentiated (an array under
    differentiation that the function did not stop_gradient is refused)."""
    if mod is None:
        return ()
    arrays = (jnp.asarray(mod.scalars, jnp.float32),) if mod.scalars else ()
    for slot, array in enumerate(mod.tensors):
        if _score_mod.learned(array, stopped):
            raise NotSupportedError(f"score_mod: captured array t{slot} is being differentiated: gradients of arrays "
                                    "inside a score modifier are not built yet (stop_gradient it, or pass it as bias=)")
        want = tuple(spec.score_mod_tensor_shape(slot))
        if tuple(array.shape) != want:
            raise invalid_argument(f"score_mod.t{slot}.shape", tuple(array.shape),
                                   f"shape {want}, the sizes its indices span in this call")
        arrays += (jax.lax.stop_gradient(jnp.asarray(array, jnp.float32)),)
    return arrays


def _require_arrays(ragged, sink, softmax, dropout_rate, dropout_key, seq_len_q, seq_len_kv, cu_seqlens_q,
                    cu_seqlens_kv, max_seqlen_q, max_seqlen_kv):
    """What the core cannot see: which of the API's optional arrays came (_config.require_arrays,
    shared with fusedattn.torch), and a key for dropout."""
    _config.require_arrays(ragged, sink=sink, softmax=softmax, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                           cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                           max_seqlen_kv=max_seqlen_kv)
    if dropout_rate > 0.0 and dropout_key is None:
        raise invalid_argument("dropout_key", None, "a JAX PRNG key when dropout_rate > 0")


def _int32(x):
    return jnp.asarray(x, jnp.int32)


def paged_attention(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, *, layout: str = "bshd",
                    cache_layout: str = "bshd", causal: bool = True, align: str = "bottom_right",
                    window: Tuple[int, int] = (-1, -1), scale: Optional[float] = None, seq_len_q=None,
                    cu_seqlens_q=None, max_seqlen_q: int = 0):
    """Attention over paged K/V caches (inference: no gradient). k_cache, v_cache: pools of pages
    in `cache_layout` with a page where the layout has its batch entry ("bshd": [pages, page_size,
    h_kv, d]; "sbhd": [page_size, pages, h_kv, d]); page_table_k / page_table_v: int32 [b, pages a
    sequence], each entry a page of the pool (also past a sequence's length); seq_len_kv: int32
    [b], the tokens each sequence has. q in `layout` ("bshd", "sbhd", or "thd" with cu_seqlens_q
    and max_seqlen_q); seq_len_q defaults to full query rows. Decode is q with one token a
    sequence, bottom-right causal (the defaults)."""
    ragged = layout == "thd"
    if ragged and (cu_seqlens_q is None or max_seqlen_q <= 0):  # what the core cannot see, in torch's words
        raise invalid_argument("cu_seqlens_q", cu_seqlens_q, "cu_seqlens_q and max_seqlen_q with thd")
    batch, pages = page_table_k.shape
    config = _config.config(layout, cache_layout, causal=causal, window=tuple(window), align=align, padding=True,
                            stats=False, kv_pages=pages)
    call, spec = _traced(config, scale, (max_seqlen_q, 0), q, k_cache, v_cache,
                         cu_seqlens_q.shape[0] - 1 if ragged else 0)
    seq_len_kv = _int32(seq_len_kv)
    if ragged:
        extras = (_int32(cu_seqlens_q), jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(seq_len_kv)]))
    else:
        extras = (jnp.full((batch,), spec.seq_q, jnp.int32) if seq_len_q is None else _int32(seq_len_q), seq_len_kv)
    tables = (_int32(page_table_k), _int32(page_table_v))
    return _call(FORWARD, call, (spec.heads_q, spec.heads_kv))(q, k_cache, v_cache, *extras, *tables)


from ._fp8 import Fp8State, fp8_attention, fp8_state  # noqa: E402  (FP8: _fp8.py)
from ._context_parallel import context_parallel_attention, load_balance, unbalance  # noqa: E402
