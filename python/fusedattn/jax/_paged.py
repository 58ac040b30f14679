"""fusedattn.jax.paged_attention: attention over paged K/V caches, one forward call (inference)."""
from typing import Optional, Tuple

import jax.numpy as jnp

from .. import _config
from ..errors import invalid_argument
from ._calls import FORWARD, as_int32, traced_call
from ._kernels import pass_function


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
    call, spec = traced_call(config, q, k_cache, v_cache, scale=scale, max_seqlen=(max_seqlen_q, 0),
                             sequences=cu_seqlens_q.shape[0] - 1 if ragged else 0)
    seq_len_kv = as_int32(seq_len_kv)
    if ragged:
        extras = (as_int32(cu_seqlens_q), jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(seq_len_kv)]))
    else:
        extras = (jnp.full((batch,), spec.seq_q, jnp.int32) if seq_len_q is None else as_int32(seq_len_q), seq_len_kv)
    tables = (as_int32(page_table_k), as_int32(page_table_v))
    return pass_function(FORWARD, call, (spec.heads_q, spec.heads_kv))(q, k_cache, v_cache, *extras, *tables)
