"""fusedattn.torch — the PyTorch adapter.

    from fusedattn.torch import attention
    out = attention(q, k, v, layout="bshd", causal=True)           # q, k, v: [b, s, h, d]
    out = attention(q, k, v, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                    max_seqlen_q=m, max_seqlen_kv=m, causal=True)   # packed sequences: [t, h, d]

It only translates. A call's keyword arguments become one frozen core Config (fusedattn/_config.py,
shared with fusedattn.jax); its tensors become (dtype, sizes, strides) views, so views of packed
buffers work as they are; the core builds and validates the spec, finds the plan in its one bounded
cache and runs it. Nothing is cached here but configs.

A call takes one of three roads:
  1. plain eager calls (dense or packed sequences with their offsets; no bias, sink, dropout,
     lengths or extra outputs), inference and training alike, go straight to C++
     (fusedattn._torch_ops: the core, and a C++ autograd node for the backward), where Python
     would cost more than the attention at small sizes;
  2. other eager calls run the operator bodies (_bodies.py) directly, inside an autograd.Function
     when a gradient is needed (the dispatcher costs more than the rest);
  3. compiled code, meta tensors, tensor subclasses and calls under a dispatch mode go through the
     registered operators fusedattn::forward / fusedattn::backward (_operators.py), whose fake
     implementations give torch.compile the shapes without a graph break.
fp8_attention takes roads 2 and 3 (its operators fusedattn::fp8_forward / fusedattn::fp8_backward
are in _fp8_operators.py).

The modules beneath, each importing only those below it: the features (_fp8.py, _context_parallel.py,
flex_attention's _flex_tiles.py and _flex_run.py, _score_mod.py, _fallback.py, _sink_decode.py: a
sink in a decode step that fusedattn's decode kernel does not take, or in compiled code, as the vanilla call
merged with the sink), then what every call
shares (_operators.py, _bodies.py, _call_config.py, _tensors.py), road 1's loader (_fast_path.py, which compiles the C++ path for the
installed PyTorch where the package was not built against it), then fusedattn's framework-free
helpers and its compiled core.
"""
import functools
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _config, _fp8_cache
from ..errors import NotSupportedError, invalid_argument
from . import _documents, _fallback, _flex_run, _flex_tiles, _paged, _score_mod, _sink_decode
from ._bodies import require_one_cuda_device
from ._call_config import config_text, plain_config_id as _plain_config_id
from ._context_parallel import context_parallel_attention, load_balance, unbalance
from ._fp8 import fp8_attention
from ._fp8_state import Fp8State
from ._fp8_tensor import Fp8Tensor, fp8_quantize
from ._operators import attend, eager_road
from ._fast_path import shared as _load_fast_path
from ._tensors import Extras

_fast = _load_fast_path()  # road 1, the C++ eager path, for this PyTorch (_fast_path.py), or None

__all__ = ["attention", "paged_attention", "scaled_dot_product_attention", "flex_attention", "Attention",
           "fp8_attention", "Fp8State", "Fp8Tensor", "fp8_quantize", "context_parallel_attention", "load_balance",
           "unbalance"]


def attention(q: Tensor, k: Tensor, v: Tensor, *, layout: str = "bshd", causal: bool = False,
              align: str = "top_left", window: Tuple[int, int] = (-1, -1), scale: Optional[float] = None,
              bias: Optional[Tensor] = None, alibi: bool = False, softmax: str = "vanilla",
              sink: Optional[Tensor] = None, dropout_p: float = 0.0, deterministic: bool = False,
              cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_kv: Optional[Tensor] = None,
              max_seqlen_q: int = 0, max_seqlen_kv: int = 0, seq_len_q: Optional[Tensor] = None,
              seq_len_kv: Optional[Tensor] = None, return_stats: bool = False, return_max_logit: str = "",
              score_mod=None, mask_mod=None, fallback: bool = False):
    """Fused attention of q, k, v in `layout` ("bshd", "sbhd", "bhsd", or "thd" with cumulative
    sequence offsets). Any strides: views into packed QKV or KV buffers work as they are.

    causal / window (left, right; -1 open) and align ("top_left" or "bottom_right", the KV-cache
    convention) place the mask; seq_len_q / seq_len_kv (int32 [b]) make each entry's lengths
    runtime data (padding: O and the gradients are zero past them); bias is a post-scale bias
    [b|1, h|1, s_q|1, s_kv] (its gradient is computed when it requires grad); alibi adds ALiBi;
    softmax is "vanilla", "off_by_one" or "sink" (with `sink`, float32 [h_q], learnable).
    dropout_p > 0 drops attention probabilities with a Philox seed and offset that PyTorch's CUDA
    generator draws on the device: CUDA graph replays draw anew, torch.manual_seed replays a mask,
    and the backward uses the forward's.

    score_mod is FlexAttention's: a function (score, b, h, q_idx, kv_idx) -> score applied to each
    scaled score before the masks, traced once into the core's expression (numbers in it become
    runtime scalars; tensors it indexes by b, h, q_idx, kv_idx are read at each call). It combines
    with every mask, lengths and grouped heads; an operation it cannot express raises
    NotSupportedError naming it. Terms added to the score that gather from a tensor (a
    relative-position table indexed by a clamped distance) or read a tensor that requires grad run
    as a bias (evaluated with torch operations on index grids), and their tensors get gradients.
    mask_mod is FlexAttention's mask function (b, h, q_idx, kv_idx) -> bool, traced the same way:
    keys it drops get -inf after score_mod (flex_attention takes it from a BlockMask).

    Returns O in q's layout with d_v; with return_stats also the statistics (float32 [b, h_q, s_q],
    or [t, h_q] for thd), and with return_max_logit="row" / "head" also the max logit (float32
    [b, h_q, s_q] / [h_q]), in that order, as a tuple.

    Errors are fusedattn.errors classes, worded by the core as for every adapter. With
    fallback=True, a configuration fusedattn does not support (NotSupportedError, and nothing else)
    runs PyTorch's own attention instead, and the reason is logged once per configuration; a
    configuration PyTorch cannot compute the same way (ALiBi, sink or off-by-one softmax, lengths,
    thd, statistics or max logit) raises as before.
    """
    window = tuple(window)
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, bias, sink))
    sink_decode = _sink_decode.applies(q, layout, softmax=softmax, needs_grad=grads, return_stats=return_stats,
                                       return_max_logit=return_max_logit, seq_len_q=seq_len_q)
    if sink_decode:
        # Eager, the core runs a sink decode on fusedattn's decode kernel, and refuses what the kernel
        # does not take (cuDNN refuses sinks on one query row): those, and compiled code, whose
        # operator cannot ask, take the vanilla call joined with the sink.
        joined_with_the_sink = functools.partial(
            _sink_decode.run, attention, q, k, v, sink, layout=layout, return_stats=return_stats, causal=causal,
            align=align, window=window, scale=scale, bias=bias, alibi=alibi, dropout_p=dropout_p,
            deterministic=deterministic, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, score_mod=score_mod,
            mask_mod=mask_mod, fallback=fallback)
        if not eager_road(q, k, v):
            return joined_with_the_sink()
    if mask_mod is not None and not causal and window == (-1, -1):
        band = _score_mod.mask_structure(mask_mod)
        if band is not None and band[0] == "band":  # cuDNN's own band mask, which skips what it drops
            window, mask_mod = (band[1], 0), None
    offsets = (cu_seqlens_q is not None, cu_seqlens_kv is not None)  # packed sequences (thd) need both
    plain = (bias is None and sink is None and not dropout_p and seq_len_q is None and seq_len_kv is None
             and softmax != "sink" and not return_stats and not return_max_logit and not fallback and mask_mod is None
             and offsets == ((True, True) if layout == "thd" else (False, False)))
    if plain and _fast is not None and q.is_cuda and not torch.compiler.is_compiling():
        # A score_mod whose only runtime values are its scalars (a softcap) takes road 1 too.
        mod = _score_mod.scalars_only(score_mod, q.device)
        if mod is not None:
            config_id = _plain_config_id(layout, causal, window, align, alibi, softmax, deterministic, mod[0])
            out = _fast.forward(q, k, v, config_id, scale, mod[1]) if layout != "thd" else _fast.ragged_forward(
                q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, config_id, scale, mod[1])
            if out is not NotImplemented:
                return out
    require_one_cuda_device(q, k, v)
    ragged = layout == "thd"
    _config.require_arrays(ragged=ragged, sink=sink, softmax=softmax, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                           cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                           max_seqlen_kv=max_seqlen_kv)
    mod_text, mod_tensors, mod_bias = ("", {}, None) if score_mod is None and mask_mod is None else \
        _score_mod.prepare(score_mod, q, k, layout, mask_mod=mask_mod)
    if mod_bias is not None:  # the function's gathered or learned terms, added to the score as a bias
        bias = mod_bias if bias is None else bias + mod_bias  # two bias shapes broadcast to one
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, bias, sink))
    if bias is not None:
        bias = bias.contiguous()
    config = config_text(layout=layout, causal=causal, window=window, align=align,
                         bias_grad=bias is not None and bias.requires_grad, alibi=alibi, softmax=softmax,
                         dropout=float(dropout_p), deterministic=deterministic,
                         padding=ragged or seq_len_q is not None, max_logit=return_max_logit,
                         stats=needs_grad or return_stats, score_mod=mod_text)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    # Dropout's seed and offset, drawn on the device by PyTorch's own CUDA generator: a replayed
    # CUDA graph draws fresh ones, torch.manual_seed gives the same mask again, and the backward
    # reuses the forward's pair.
    rng = torch.randint(0, 2 ** 62, (2,), device=q.device, dtype=torch.int64) if dropout_p > 0.0 else None
    extras = Extras(rng=rng, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, seq_len_q=seq_len_q,
                    seq_len_kv=seq_len_kv, **mod_tensors)
    try:
        o, stats, max_logit = attend(q, k, v, bias=bias, sink=sink, extras=extras, config=config, scale=scale,
                                     max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, needs_grad=needs_grad)
    except NotSupportedError as error:
        if sink_decode:
            return joined_with_the_sink()
        if not fallback or ragged or return_stats or return_max_logit or seq_len_q is not None or alibi or \
                softmax != "vanilla" or score_mod is not None or mask_mod is not None:
            raise
        _fallback.log_once(config, q, k, error)
        return _fallback.run(q, k, v, layout=layout, window=_config.parse(config).window, align=align, scale=scale,
                             bias=bias, dropout_p=dropout_p)
    extra = ((stats,) if return_stats else ()) + ((max_logit,) if return_max_logit else ())
    return (o,) + extra if extra else o


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table_k: Tensor, page_table_v: Tensor,
                    seq_len_kv: Tensor, *, layout: str = "bshd", cache_layout: str = "bshd", causal: bool = True,
                    align: str = "bottom_right", window: Tuple[int, int] = (-1, -1), scale: Optional[float] = None,
                    seq_len_q: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                    max_seqlen_q: int = 0, descale_k: Optional[Tensor] = None,
                    descale_v: Optional[Tensor] = None) -> Tensor:
    """Attention over paged K/V caches (inference). k_cache, v_cache: pools of pages in
    `cache_layout` with a page where the layout has its batch entry ("bshd": [pages, page_size,
    h_kv, d]; "sbhd": [page_size, pages, h_kv, d]); page_table_k / page_table_v: int32 [b, pages a
    sequence], each entry a page of the pool; seq_len_kv: int32 [b], the tokens each sequence has.
    q in `layout` ("bshd", "sbhd", or "thd" with cu_seqlens_q and max_seqlen_q); seq_len_q defaults
    to full query rows. Decode is q with one token a sequence, bottom-right causal (the defaults).

    FP8 caches: k_cache and v_cache in torch.float8_e4m3fn beside a float16 or bfloat16 q, with
    descale_k and descale_v, float32 tensors on q's device (K = k_cache * descale_k), of one element
    or one for each K/V head ([h_kv]); O comes in q's dtype. They run on fusedattn's decode kernel,
    for 1 to 16 query tokens a sequence (fusedattn.check_support says so, and why not elsewhere).

    Eager calls with a dense q go straight to C++ (road 1, as attention()'s plain calls do); thd
    queries, compiled code, meta tensors and subclasses take roads 2 and 3 with the same results
    and errors."""
    window = tuple(window)
    fp8_scaling = _fp8_cache.scaling(k_cache, v_cache, descale_k, descale_v)
    if _fast is not None and layout != "thd" and not torch.compiler.is_compiling():
        config_id = _paged.config_id(layout, cache_layout, causal, window, align, page_table_k.shape, fp8_scaling)
        out = _fast.paged_forward(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, seq_len_q, config_id,
                                  scale, descale_k, descale_v)
        if out is not NotImplemented:
            return out
    return _paged.paged_forward(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, layout=layout,
                                cache_layout=cache_layout, causal=causal, align=align, window=window, scale=scale,
                                seq_len_q=seq_len_q, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                fp8_scaling=fp8_scaling, descale_k=descale_k, descale_v=descale_v)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, **options):
    """torch.nn.functional.scaled_dot_product_attention's signature ([b, h, s, d] tensors): a
    floating-point attn_mask is the additive bias; boolean masks are not taken (use causal/window)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        raise invalid_argument("attn_mask.dtype", attn_mask.dtype,
                               "a floating-point additive bias (boolean masks: use is_causal or window=)")
    return attention(query, key, value, layout="bhsd", causal=is_causal, scale=scale, bias=attn_mask,
                     dropout_p=dropout_p, **options)


def flex_attention(query: Tensor, key: Tensor, value: Tensor, score_mod=None, block_mask=None,
                   scale: Optional[float] = None, enable_gqa: bool = False, return_lse: bool = False,
                   kernel_options=None):
    """torch.nn.attention.flex_attention.flex_attention's signature and meaning, run by fusedattn:
    [b, h, s, d] tensors, score_mod(score, b, h, q_idx, kv_idx) -> score, and a BlockMask from
    create_block_mask, whose mask_mod drops keys (-inf after score_mod). Returns O, and with
    return_lse also the log-sum-exp of each row's scaled scores (float32 [b, h, s_q]).
    kernel_options tunes FlexAttention's own kernels and changes nothing here. Masks are lowered by
    structure: causal and sliding windows run as cuDNN's band (fusedattn/_mask_structure.py); a
    document mask (doc[q_idx] == doc[kv_idx], causal or not, over ids that form runs) as packed
    sequences in eager calls (_documents.py); prefix-LM, and in eager calls any mask by its
    BlockMask's tiles, as the pieces of a schedule (fusedattn/_tile_schedule.py: full rectangles
    unmasked, bands as cuDNN's band, the rest as conditions, merged by log-sum-exp; _flex_tiles.py,
    _flex_run.py) where the cost model says the pieces beat one call with the mask as conditions
    over the whole square. Rows that see no key give O 0 and log-sum-exp -inf."""
    del kernel_options
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise invalid_argument("query.shape", tuple(query.shape), "[b, h, s, d] query, key and value")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise invalid_argument("key.shape", tuple(key.shape),
                               f"{query.shape[1]} heads as the query has, or enable_gqa=True for grouped heads")
    mask_mod = None
    if block_mask is not None:
        lengths = tuple(getattr(block_mask, "seq_lengths", (query.shape[2], key.shape[2])))
        if lengths != (query.shape[2], key.shape[2]):
            raise invalid_argument("block_mask.seq_lengths", lengths,
                                   f"the query's and key's lengths, {(query.shape[2], key.shape[2])}")
        # FlexAttention's noop_mask (a BlockMask made without one) keeps every key of its blocks.
        mask_mod = None if getattr(block_mask.mask_mod, "__name__", "") == "noop_mask" else block_mask.mask_mod
    docs = _documents.documents(mask_mod, score_mod, query, key) if _flex_tiles.traceable(mask_mod) else None
    if docs is not None:
        batch, length = query.shape[0], query.shape[2]
        out = attention(_documents.pack(query), _documents.pack(key), _documents.pack(value), layout="thd",
                        cu_seqlens_q=docs.cu_seqlens, cu_seqlens_kv=docs.cu_seqlens, max_seqlen_q=docs.longest,
                        max_seqlen_kv=docs.longest, causal=docs.causal, scale=scale, score_mod=score_mod,
                        return_stats=return_lse)
        if return_lse:
            return _documents.unpack(out[0], batch, length), _documents.unpack(out[1], batch, length)
        return _documents.unpack(out, batch, length)
    schedule = _flex_tiles.plan(mask_mod, block_mask, score_mod, query, key)
    if schedule is not None:
        return _flex_run.run(schedule, query, key, value, score_mod=score_mod, mask_mod=mask_mod, scale=scale,
                             return_lse=return_lse, attention=attention)
    return attention(query, key, value, layout="bhsd", scale=scale, score_mod=score_mod, mask_mod=mask_mod,
                     return_stats=return_lse)


class Attention(torch.nn.Module):
    """fusedattn.torch.attention with its options fixed at construction; a learnable sink (float32
    [heads]) when softmax="sink" and `heads` is given."""

    def __init__(self, *, layout: str = "bshd", causal: bool = False, heads: int = 0, softmax: str = "vanilla",
                 **options):
        super().__init__()
        self.layout, self.causal, self.softmax, self.options = layout, causal, softmax, options
        self.sink = torch.nn.Parameter(torch.zeros(heads)) if softmax == "sink" and heads > 0 else None

    def forward(self, q: Tensor, k: Tensor, v: Tensor, **call_options):
        return attention(q, k, v, layout=self.layout, causal=self.causal, softmax=self.softmax, sink=self.sink,
                         **self.options, **call_options)

    def extra_repr(self):
        return f"layout={self.layout}, causal={self.causal}, softmax={self.softmax}"
