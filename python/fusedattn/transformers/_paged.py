"""Continuous batching through fusedattn: transformers' "paged|fusedattn" implementation, which its
generate_batch() and serving loop take. Each forward step packs the new tokens of every scheduled
request into one row; the model's attention gets them beside transformers' PagedAttentionCache and
the packed sequences' offsets (cu_seq_lens_q; cu_seq_lens_k, per layer type where the model has
full and sliding layers), and no mask (transformers builds one only for its paged eager and sdpa).
The new keys and values go into the cache and each request's keys come back from it (cache.update,
transformers' own write and read), then one fusedattn call runs every request as packed sequences
(thd), causal bottom-right (a request's new tokens are the last of its keys), with the layer's
window, softcap and sinks as the other roads take them."""
import torch

from .. import torch as fusedattn_torch


def is_paged(kwargs):
    """Whether a call is a continuous-batching step (its paged cache among the keywords)."""
    return kwargs.get("cache") is not None and "read_index" in kwargs and "write_index" in kwargs


def _of_layer(value, window):
    """A per-layer-type keyword (a dict of "full_attention" and "sliding_attention") for this layer."""
    if isinstance(value, dict):
        return value["sliding_attention" if window != (-1, -1) else "full_attention"]
    return value


def forward(module, query, key, value, kwargs, *, window, options):
    """O [total_q, h_q, d_v] of one continuous-batching step: query [1, h_q, total_q, d], key and value
    [1, h_kv, new tokens, d] (the step's own, before the cache)."""
    key, value = kwargs["cache"].update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                                        read_index=kwargs["read_index"], write_index=kwargs["write_index"])
    q = query.transpose(1, 2).squeeze(0)  # [total_q, h_q, d], token-major as the projection wrote it
    k, v = key.contiguous(), value.contiguous()  # [total_kv, h_kv, d]
    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    cu_kv = _of_layer(kwargs["cu_seq_lens_k"], window).to(torch.int32)
    return fusedattn_torch.attention(q, k, v, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                                     max_seqlen_q=int(kwargs["max_seqlen_q"]),
                                     max_seqlen_kv=int(_of_layer(kwargs["max_seqlen_k"], window)), causal=True,
                                     align="bottom_right", window=window, **options)
