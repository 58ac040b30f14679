"""fusedattn.jax.paged_attention: attention over paged K/V caches, one forward call (inference). A
decode step's program is that one custom call on the arrays as the caller holds them: no length
array is filled for q (the handler passes none, and the core takes every row of q), and the tables
and lengths go in as they are where they are int32 already."""
import dataclasses
from typing import Optional, Tuple

import jax.numpy as jnp

from .. import _config, _fp8_cache
from ..errors import invalid_argument
from ._calls import FORWARD, as_int32, traced_call
from ._kernels import pass_function


def paged_attention(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, *, layout: str = "bshd",
                    cache_layout: str = "bshd", causal: bool = True, align: str = "bottom_right",
                    window: Tuple[int, int] = (-1, -1), scale: Optional[float] = None, seq_len_q=None,
                    cu_seqlens_q=None, max_seqlen_q: int = 0, descale_k=None, descale_v=None):
    """Attention over paged K/V caches (inference: no gradient). k_cache, v_cache: pools of pages
    in `cache_layout` with a page where the layout has its batch entry ("bshd": [pages, page_size,
    h_kv, d]; "sbhd": [page_size, pages, h_kv, d]); page_table_k / page_table_v: int32 [b, pages a
    sequence], each entry a page of the pool (also past a sequence's length); seq_len_kv: int32
    [b], the tokens each sequence has. q in `layout` ("bshd", "sbhd", or "thd" with cu_seqlens_q
    and max_seqlen_q); seq_len_q defaults to full query rows. Decode is q with one token a
    sequence, bottom-right causal (the defaults).

    FP8 caches: k_cache and v_cache in float8_e4m3fn beside a float16 or bfloat16 q, with descale_k
    and descale_v, float32 (K = k_cache * descale_k), of one element or one for each K/V head
    ([h_kv]); O comes in q's dtype. They run on fusedattn's decode kernel, for 1 to 16 query tokens a
    sequence (fusedattn.check_support says so, and why not elsewhere)."""
    ragged = layout == "thd"
    if ragged and (cu_seqlens_q is None or max_seqlen_q <= 0):  # what the core cannot see, in torch's words
        raise invalid_argument("cu_seqlens_q", cu_seqlens_q, "cu_seqlens_q and max_seqlen_q with thd")
    descales = tuple(None if d is None else jnp.asarray(d) for d in (descale_k, descale_v))
    fp8_scaling = _fp8_cache.scaling(k_cache, v_cache, *descales)
    config = _config.config(layout, cache_layout, causal=causal, window=tuple(window), align=align, padding=True,
                            stats=False, kv_pages=_config.page_count(page_table_k), fp8_scaling=fp8_scaling)
    call, spec = traced_call(config, q, k_cache, v_cache, scale=scale, max_seqlen=(max_seqlen_q, 0),
                             sequences=cu_seqlens_q.shape[0] - 1 if ragged else 0)
    if fp8_scaling:
        _fp8_cache.require_descales(spec, fp8_scaling, *descales)
        # One element each as the scalar the handler reads; one a K/V head as [h_kv].
        descales = tuple(d.reshape(()) if fp8_scaling == "tensor" else d for d in descales)
        call = dataclasses.replace(call, fp8_cache=True)
    tables = (as_int32(page_table_k), as_int32(page_table_v))
    seq_len_kv = as_int32(seq_len_kv)
    seq_len_q = None if ragged or seq_len_q is None else as_int32(seq_len_q)
    _config.require_paged_arrays(spec, page_table_k=tables[0], page_table_v=tables[1], seq_len_kv=seq_len_kv,
                                 seq_len_q=seq_len_q)
    if ragged:  # the core places thd's sequences by offsets, the keys' too
        lengths = (as_int32(cu_seqlens_q), jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(seq_len_kv)]))
    elif seq_len_q is None:
        call, lengths = dataclasses.replace(call, query_lengths=False), (seq_len_kv,)
    else:
        lengths = (seq_len_q, seq_len_kv)
    cache_scales = descales if fp8_scaling else ()
    return pass_function(FORWARD, call, (spec.heads_q, spec.heads_kv))(q, k_cache, v_cache, *lengths, *tables,
                                                                       *cache_scales)
