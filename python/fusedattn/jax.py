"""fusedattn.jax — the JAX adapter: XLA FFI custom calls into the same core.

    from fusedattn.jax import attention
    out = attention(q, k, v, causal=True)     # [batch, seq, heads, dim], like jax.nn.dot_product_attention

The spec of a call is fixed while tracing (from the arrays' shapes) and travels as the custom
call's attribute; XLA's INSTANTIATE stage parses it, the INITIALIZE stage before each execution
makes sure the plan for that device exists (built once), and the execute stage only enqueues it
on XLA's stream, with a workspace XLA planned as one of the call's results, so it is safe for
command buffers.

Differentiable (jax.custom_vjp over the core's backward); works under jit, grad, jax.checkpoint
and vmap (_jax_batching: the mapped axis joins the batch where it can). Under a mesh with q, k, v
sharded over batch and heads, each device calls on its own shard and nothing is gathered
(_jax_partition).
"""
import functools
import math
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from . import _jax_batching, _jax_calls, _jax_partition, _layouts, _options
from .errors import invalid_argument

__all__ = ["attention", "paged_attention"]

# The kernel behind each kind of call; tests put plain-JAX references here to check batching and
# partitioning without a GPU.
_KERNELS = {kind: functools.partial(_jax_calls.run, kind) for kind in ("inference", "forward", "backward")}


@functools.lru_cache(maxsize=None)
def _call(kind, config, heads):
    """The call of `kind` for `config` and (h_q, h_kv): a function of arrays alone, with its vmap
    rule and its partitioning."""
    partitioned = _jax_partition.partitioned(_kernel, kind, config, *heads)
    return _jax_batching.with_batching(partitioned, kind, config)


def _kernel(kind):
    return _KERNELS[kind]


def _heads(q, k, config):
    """(h_q, h_kv); k is a pool of pages for a paged call."""
    k_layout = config.cache_layout if config.pages else config.layout
    k_axis = 1 if config.ragged and not config.pages else _layouts.AXES[k_layout][1]
    return _jax_calls.heads_q(q, config), k.shape[k_axis]


def _present(*arrays):
    return tuple(x for x in arrays if x is not None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(config, q, k, v, bias, sink, rng, lengths, offsets):
    """O, and the max logit where asked for (else None)."""
    out = _call("inference", config, _heads(q, k, config))(q, k, v, *_present(bias, sink, rng, *lengths, *offsets))
    return tuple(out) if config.max_logit else (out, None)


def _attention_fwd(config, q, k, v, bias, sink, rng, lengths, offsets):
    extras = _present(bias, sink, rng, *lengths, *offsets)
    o, stats, *max_logit = _call("forward", config, _heads(q, k, config))(q, k, v, *extras)
    return (o, max_logit[0] if max_logit else None), (q, k, v, o, stats, bias, sink, rng, lengths, offsets)


def _attention_bwd(config, residuals, cotangents):
    d_o, _ = cotangents  # the max logit is not differentiated
    q, k, v, o, stats, bias, sink, rng, lengths, offsets = residuals
    grads = _call("backward", config, _heads(q, k, config))(q, k, v, o, stats, d_o.astype(o.dtype),
                                                            *_present(bias, sink, rng, *lengths, *offsets))
    d_q, d_k, d_v, *rest = grads
    d_bias = rest.pop(0) if config.bias_grad else (None if bias is None else jnp.zeros_like(bias))
    d_sink = rest.pop(0) if config.sink else None

    def no_gradient(x):  # integer inputs (dropout's rng, lengths, offsets) take float0 cotangents
        return None if x is None else jnp.zeros(x.shape, jax.dtypes.float0)
    return (d_q, d_k, d_v, d_bias, d_sink, no_gradient(rng), tuple(map(no_gradient, lengths)),
            tuple(map(no_gradient, offsets)))


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
              return_max_logit: str = ""):
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

    Errors in the arguments raise fusedattn.errors classes while tracing; where the tracing
    process has a GPU, an unsupported configuration raises NotSupportedError with every reason.
    """
    ragged = layout == "thd"
    if not ragged and layout not in _layouts.AXES:
        raise invalid_argument("layout", layout, "one of bshd, sbhd, bhsd, thd")
    if ragged and (cu_seqlens_q is None or cu_seqlens_kv is None or max_seqlen_q <= 0 or max_seqlen_kv <= 0):
        raise invalid_argument("cu_seqlens_q", cu_seqlens_q,
                               "cu_seqlens_q, cu_seqlens_kv (int32 [n + 1]) and max_seqlen_q, max_seqlen_kv with thd")
    if not ragged and (cu_seqlens_q is not None or cu_seqlens_kv is not None):
        raise invalid_argument("cu_seqlens_q", "given", "layout='thd' (packed sequences)")
    if (softmax == "sink") != (sink is not None):
        raise invalid_argument("sink", "given" if sink is not None else None, "a sink exactly when softmax='sink'")
    if (seq_len_q is None) != (seq_len_kv is None) or (ragged and seq_len_q is not None):
        raise invalid_argument("seq_len_q", "given" if seq_len_q is not None else None,
                               "seq_len_q and seq_len_kv together, with a dense layout")
    if return_max_logit not in ("", "row", "head"):
        raise invalid_argument("return_max_logit", return_max_logit, "'row', 'head' or ''")
    if dropout_rate > 0.0 and dropout_key is None:
        raise invalid_argument("dropout_key", None, "a JAX PRNG key when dropout_rate > 0")
    if causal:
        window = (window[0], 0)
    kind = "none"
    if bias is not None:
        if ragged:
            raise invalid_argument("bias", "given", "a dense layout (no bias with packed sequences)")
        dims = _layouts.logical(q.shape, _layouts.row_major_strides(q.shape), layout)[0]
        kind = _options.bias_kind(bias.shape, dims[0], dims[1], dims[2],
                                  _layouts.logical(k.shape, _layouts.row_major_strides(k.shape), layout)[0][2])
    padding = seq_len_q is not None
    options = _options.options_text(window[0], window[1], align, softmax, kind, alibi, deterministic,
                                    ragged or padding, float(dropout_rate), return_max_logit)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    config = _jax_calls.Config(layout=layout, options=options, scale=scale, bias=kind,
                               bias_grad=bias is not None and bias_grad, sink=sink is not None,
                               dropout=dropout_rate > 0.0, max_seqlen=(int(max_seqlen_q), int(max_seqlen_kv)),
                               padding=padding, max_logit=return_max_logit)
    rng = _dropout_rng(dropout_key) if dropout_rate > 0.0 else None
    lengths = tuple(map(_int32, (seq_len_q, seq_len_kv))) if padding else ()
    offsets = tuple(map(_int32, (cu_seqlens_q, cu_seqlens_kv))) if ragged else ()
    o, max_logit = _attention(config, q, k, v, bias, None if sink is None else jnp.asarray(sink, jnp.float32), rng,
                              lengths, offsets)
    return (o, max_logit) if return_max_logit else o


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
    if layout not in ("bshd", "sbhd", "thd") or cache_layout not in ("bshd", "sbhd"):
        raise invalid_argument("layout/cache_layout", f"{layout}/{cache_layout}",
                               "bshd, sbhd or thd for q; bshd or sbhd for the caches")
    ragged = layout == "thd"
    if ragged and (cu_seqlens_q is None or max_seqlen_q <= 0):
        raise invalid_argument("cu_seqlens_q", cu_seqlens_q, "cu_seqlens_q and max_seqlen_q with thd")
    window = (window[0], 0) if causal else window
    batch, pages = page_table_k.shape
    page_size = k_cache.shape[_layouts.AXES[cache_layout][2]]
    options = _options.options_text(window[0], window[1], align, "vanilla", "none", False, False, True, 0.0, "")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    config = _jax_calls.Config(layout=layout, options=options, scale=scale, padding=not ragged, pages=pages,
                               cache_layout=cache_layout, max_seqlen=(int(max_seqlen_q), pages * page_size))
    seq_len_kv = _int32(seq_len_kv)
    if ragged:
        extras = (_int32(cu_seqlens_q), jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(seq_len_kv)]))
    else:
        s_q = _layouts.logical(q.shape, _layouts.row_major_strides(q.shape), layout)[0][2]
        extras = (jnp.full((batch,), s_q, jnp.int32) if seq_len_q is None else _int32(seq_len_q), seq_len_kv)
    tables = (_int32(page_table_k), _int32(page_table_v))
    return _call("inference", config, _heads(q, k_cache, config))(q, k_cache, v_cache, *extras, *tables)
