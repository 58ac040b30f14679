"""paged_attention's general path (roads 2 and 3: thd queries, compiled code, meta tensors, and what
the C++ path leaves), and the config id its C++ path (torch_paged.h) is offered, both from one config
so that both build the same spec."""
import functools
import math

import torch

from .. import _config
from ..errors import invalid_argument
from ._bodies import require_one_cuda_device
from ._call_config import config_text
from ._operators import attend
from ._tensors import Extras


@functools.lru_cache(maxsize=4096)
def config_id(layout, cache_layout, causal, window, align, table_shape, fp8_scaling=""):
    """The registered id of a paged call's config, for the C++ path, keyed on the page table's shape
    (its second axis is the config's kv_pages). A table that is not [b, pages] gives a config without
    pages, which the C++ path leaves to the general one, where _config.page_count says what is wrong."""
    pages = table_shape[1] if len(table_shape) == 2 else 0
    return _config.config(layout, cache_layout, causal=causal, window=window, align=align, padding=True,
                          stats=False, kv_pages=pages, fp8_scaling=fp8_scaling).id


def paged_forward(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, *, layout, cache_layout, causal,
                  align, window, scale, seq_len_q, cu_seqlens_q, max_seqlen_q, fp8_scaling, descale_k, descale_v):
    """O of a paged call by road 2 or 3 (paged_attention's arguments; fp8_scaling from
    _fp8_cache.scaling, "" for a 16-bit cache)."""
    require_one_cuda_device(q, k_cache, v_cache, page_table_k=page_table_k, page_table_v=page_table_v,
                            seq_len_kv=seq_len_kv, seq_len_q=seq_len_q, cu_seqlens_q=cu_seqlens_q,
                            descale_k=descale_k, descale_v=descale_v)
    pages = _config.page_count(page_table_k)
    cu_kv = None
    if layout == "thd":
        if cu_seqlens_q is None or max_seqlen_q <= 0:
            raise invalid_argument("cu_seqlens_q", cu_seqlens_q, "cu_seqlens_q and max_seqlen_q with thd")
        cu_kv = torch.nn.functional.pad(seq_len_kv.cumsum(0, dtype=torch.int32), (1, 0))
        seq_len_q = seq_len_kv  # unused: the ragged arrays carry both lengths
    # Without seq_len_q the core takes every sequence's s_q queries: no array to fill each call.
    config = config_text(layout=layout, kv_layout=cache_layout, causal=causal, window=window, align=align,
                         padding=True, stats=False, kv_pages=pages, fp8_scaling=fp8_scaling)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    # The core reads the tables, lengths and descales by address, as dense rows: C++ takes them only so.
    by_address = {name: None if t is None else t.contiguous() for name, t in (
        ("page_table_k", page_table_k), ("page_table_v", page_table_v), ("seq_len_q", seq_len_q),
        ("seq_len_kv", seq_len_kv), ("descale_k", descale_k), ("descale_v", descale_v))}
    extras = Extras(cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_kv, **by_address)
    o, _, _ = attend(q, k_cache, v_cache, bias=None, sink=None, extras=extras, config=config, scale=scale,
                     max_seqlen_q=max_seqlen_q, max_seqlen_kv=0, needs_grad=False)
    return o
