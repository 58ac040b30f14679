"""The attention function fusedattn registers with transformers' AttentionInterface: a model's call
(q, k, v as [b, h, s, d], its mask, scaling, sliding window, softcap, sinks, dropout, and the
keywords of packed batches) as one fusedattn.torch.attention call.

The tensors go in as [b, s, h, d] views of what the model gives (no copy: fusedattn takes any
strides), so O comes back as transformers wants it, [b, s, h, d] and contiguous. Grouped heads go
in as they are. The mask picks the road (_masks.py): plain calls carry the causal mask and the
window; padded ones runtime lengths, after moving each row's real tokens to its front when they are
not already; a decode step its row of keys as a bias; packed batches go as packed sequences (thd).
Everything here is decided from shapes and Python values, so compiled code traces it in one graph."""
import functools

import torch

from .. import torch as fusedattn_torch
from ..errors import NotSupportedError
from . import _packing, _paged
from ._masks import FusedMask
from ._padding import take_rows

DTYPES = (torch.float16, torch.bfloat16)  # what cuDNN's attention computes in (FP8 has its own API)

_SOFTCAPS = {}  # cap -> its score_mod: one object per cap, so that eager calls trace each cap once


def _softcap(cap, score, b, h, q_idx, kv_idx):
    return cap * torch.tanh(score / cap)


def softcap_mod(cap):
    """FlexAttention's score_mod for an attention softcap (Gemma 2): cap * tanh(score / cap), applied
    to the scaled scores before the mask, as transformers' eager attention applies it. A partial of
    one module function: compiled code makes it anew each time it traces (a partial of constants is
    a constant there, where a function made while tracing is not); eager calls reuse one per cap."""
    if torch.compiler.is_compiling():
        return functools.partial(_softcap, cap)
    mod = _SOFTCAPS.get(cap)
    if mod is None:
        mod = _SOFTCAPS[cap] = functools.partial(_softcap, cap)
    return mod


def refuse(what, why):
    """A call the integration does not run, as the NotSupportedError the fallback takes."""
    return NotSupportedError(f"fusedattn.transformers: {what}: {why}")


def _options(dropout, scaling, softcap, s_aux):
    """The options every road shares: scale, dropout, the softcap's score_mod, the sinks."""
    options = dict(scale=scaling, dropout_p=float(dropout))
    if softcap is not None:
        options["score_mod"] = softcap_mod(float(softcap))
    if s_aux is not None:  # gpt-oss: one learned logit per head in every row's denominator
        options.update(softmax="sink", sink=s_aux.float())
    return options


def _bias_of(mask, dtype):
    """A dense mask of the model's own (bool: True keeps) as the additive bias fusedattn takes."""
    if mask.dtype == torch.bool:
        return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device), torch.finfo(dtype).min)
    return mask.to(dtype)


def _packed_call(q, k, v, packed, *, causal, window, options):
    """Packed sequences (thd) over the flattened tokens of [b, s, h, d] views."""
    batch, length = q.shape[:2]
    flat = [x.reshape(-1, *x.shape[2:]) for x in (q, k, v)]
    out = fusedattn_torch.attention(*flat, layout="thd", cu_seqlens_q=packed.cu_q, cu_seqlens_kv=packed.cu_kv,
                                    max_seqlen_q=packed.max_q, max_seqlen_kv=packed.max_kv, causal=causal,
                                    align="top_left" if packed.same else "bottom_right", window=window, **options)
    return out.view(batch, length, *out.shape[1:])


def _padded_call(q, k, v, mask, *, causal, window, options):
    """Runtime lengths over the tokens moved to each row's front (where they were not already)."""
    if mask.order_q is not None:
        q = take_rows(q, mask.order_q)
    if mask.order_kv is not None:
        k, v = take_rows(k, mask.order_kv), take_rows(v, mask.order_kv)
    out = fusedattn_torch.attention(q, k, v, layout="bshd", seq_len_q=mask.seq_len_q, seq_len_kv=mask.seq_len_kv,
                                    causal=causal, align="top_left" if mask.top_left else "bottom_right",
                                    window=window, **options)
    return out if mask.restore_q is None else take_rows(out, mask.restore_q)


def forward(module, query, key, value, mask, *, dropout, scaling, sliding_window, softcap, is_causal, s_aux, kwargs):
    """O [b, s_q, h_q, d_v] of one model call (the module docstring's roads)."""
    if kwargs.get("position_bias") is not None:
        raise refuse("position_bias", "a relative-position bias per layer (T5-style models) is not taken")
    if kwargs.get("block_table") is not None:
        raise refuse("block_table", "continuous batching's decode fast path (a block table, which transformers "
                                    "builds for flash attention only) is not wired")
    if query.dtype not in DTYPES:
        raise refuse("dtype", f"{str(query.dtype)[len('torch.'):]} attention; fusedattn computes in float16 or "
                              "bfloat16 (load the model with dtype=torch.bfloat16)")
    fused = mask if isinstance(mask, FusedMask) else None
    if mask is not None and fused is None and not isinstance(mask, torch.Tensor):
        raise refuse("attention_mask", f"a {type(mask).__name__} is not one of fusedattn's masks")
    if fused is not None and fused.kind == "custom":
        raise refuse("attention_mask", "the model adds conditions of its own to the causal mask "
                                       "(or_mask_function / and_mask_function), which need a dense mask")
    if is_causal is None:
        is_causal = fused.causal if fused is not None else getattr(module, "is_causal", True)
    if sliding_window is None and fused is not None:
        sliding_window = fused.window
    if sliding_window is not None and not is_causal:
        raise refuse("sliding_window", "a window without the causal mask (transformers' masks and its flash path "
                                       "give it different widths)")
    window = (int(sliding_window), -1) if sliding_window is not None else (-1, -1)
    options = _options(dropout, scaling, softcap, s_aux)
    if _paged.is_paged(kwargs):  # continuous batching: its packed step over the paged cache
        return _paged.forward(module, query, key, value, kwargs, window=window, options=options)
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # [b, s, h, d] views
    if isinstance(mask, torch.Tensor):  # a 4D mask the caller made: it says everything
        return fusedattn_torch.attention(q, k, v, layout="bshd", bias=_bias_of(mask, query.dtype), **options)
    if fused is not None and fused.kind == "decode":  # the bias holds the causal mask and the window
        return fusedattn_torch.attention(q, k, v, layout="bshd", bias=fused.bias.to(query.dtype), **options)
    if fused is not None and fused.kind == "padded":
        return _padded_call(q, k, v, fused, causal=is_causal, window=window, options=options)
    packed = _packing.from_keywords(kwargs, q.shape[0] * q.shape[1], k.shape[0] * k.shape[1])
    if packed is None and fused is not None and fused.packed_hint:
        if kwargs.get("position_ids") is None:
            raise refuse("position_ids", "a packed batch without its position ids or cu_seq_lens_q / cu_seq_lens_k")
        packed = _packing.from_position_ids(kwargs["position_ids"], q.shape[0], q.shape[1])
    if packed is not None:
        return _packed_call(q, k, v, packed, causal=is_causal, window=window, options=options)
    align = "top_left" if q.shape[1] == k.shape[1] else "bottom_right"  # a cache's keys end at the last query
    return fusedattn_torch.attention(q, k, v, layout="bshd", causal=is_causal, align=align, window=window, **options)
