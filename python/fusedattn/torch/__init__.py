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
  1. plain eager calls (dense, no bias, sink, dropout, lengths or extra outputs), inference and
     training alike, go straight to C++ (_torch_ops: the core, and a C++ autograd node for the
     backward), where Python would cost more than the attention at small sizes;
  2. other eager calls run the operator bodies below directly, inside an autograd.Function when a
     gradient is needed (the dispatcher costs more than the rest);
  3. compiled code, meta tensors, tensor subclasses and calls under a dispatch mode go through the
     registered operators fusedattn::forward / fusedattn::backward, whose fake implementations
     give torch.compile the shapes without a graph break.
fp8_attention takes roads 2 and 3 (its operators fusedattn::fp8_forward / fusedattn::fp8_backward
are in _torch_fp8_ops.py).
"""
import contextlib
import functools
import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import _config
from .. import _core as core
from ..errors import NotSupportedError, invalid_argument

from . import _fallback as _torch_fallback
from . import _score_mod as _torch_score_mod

try:  # the C++ eager path, built where PyTorch with CUDA was at build time
    from .. import _torch_ops as _fast
except ImportError:
    _fast = None

__all__ = ["attention", "paged_attention", "scaled_dot_product_attention", "Attention", "fp8_attention", "Fp8State",
           "Fp8Tensor", "fp8_quantize", "context_parallel_attention", "load_balance", "unbalance"]

# --- the functional API ----------------------------------------------------------------------

def attention(q: Tensor, k: Tensor, v: Tensor, *, layout: str = "bshd", causal: bool = False,
              align: str = "top_left", window: Tuple[int, int] = (-1, -1), scale: Optional[float] = None,
              bias: Optional[Tensor] = None, alibi: bool = False, softmax: str = "vanilla",
              sink: Optional[Tensor] = None, dropout_p: float = 0.0, deterministic: bool = False,
              cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_kv: Optional[Tensor] = None,
              max_seqlen_q: int = 0, max_seqlen_kv: int = 0, seq_len_q: Optional[Tensor] = None,
              seq_len_kv: Optional[Tensor] = None, return_stats: bool = False, return_max_logit: str = "",
              score_mod=None, fallback: bool = False):
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
    plain = (bias is None and sink is None and not dropout_p and seq_len_q is None and seq_len_kv is None
             and cu_seqlens_q is None and cu_seqlens_kv is None and softmax != "sink" and not return_stats
             and not return_max_logit and not fallback and score_mod is None)
    if plain and _fast is not None and layout != "thd" and not torch.compiler.is_compiling():
        out = _fast.forward(q, k, v, _plain_config_id(layout, causal, window, align, alibi, softmax, deterministic),
                            scale)
        if out is not NotImplemented:
            return out
    _require_one_cuda_device(q, k, v)
    ragged = layout == "thd"
    _config.require_arrays(ragged, sink=sink, softmax=softmax, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                           cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                           max_seqlen_kv=max_seqlen_kv)
    mod_text, mod_tensors, mod_bias = ("", {}, None) if score_mod is None else \
        _torch_score_mod.prepare(score_mod, q, k, layout)
    if mod_bias is not None:  # the function's gathered or learned terms, added to the score as a bias
        bias = mod_bias if bias is None else bias + mod_bias  # two bias shapes broadcast to one
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, bias, sink))
    if bias is not None:
        bias = bias.contiguous()
    config = _config_text(layout, "", causal, window, align, bias is not None and bias.requires_grad, alibi, softmax,
                          float(dropout_p), deterministic, ragged or seq_len_q is not None, return_max_logit,
                          needs_grad or return_stats, 0, mod_text)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    # Dropout's seed and offset, drawn on the device by PyTorch's own CUDA generator: a replayed
    # CUDA graph draws fresh ones, torch.manual_seed gives the same mask again, and the backward
    # reuses the forward's pair.
    rng = torch.randint(0, 2 ** 62, (2,), device=q.device, dtype=torch.int64) if dropout_p > 0.0 else None
    extras = _Extras(rng=rng, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, seq_len_q=seq_len_q,
                     seq_len_kv=seq_len_kv, **mod_tensors)
    try:
        o, stats, max_logit = _attend(q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv,
                                      needs_grad)
    except NotSupportedError as error:
        if not fallback or ragged or return_stats or return_max_logit or seq_len_q is not None or alibi or \
                softmax != "vanilla" or score_mod is not None:
            raise
        _torch_fallback.log_once(config, q, k, error)
        return _torch_fallback.run(q, k, v, layout, *_config.parse(config).window, align, scale, bias, dropout_p)
    extra = ((stats,) if return_stats else ()) + ((max_logit,) if return_max_logit else ())
    return (o,) + extra if extra else o


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table_k: Tensor, page_table_v: Tensor,
                    seq_len_kv: Tensor, *, layout: str = "bshd", cache_layout: str = "bshd", causal: bool = True,
                    align: str = "bottom_right", window: Tuple[int, int] = (-1, -1), scale: Optional[float] = None,
                    seq_len_q: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                    max_seqlen_q: int = 0) -> Tensor:
    """Attention over paged K/V caches (inference). k_cache, v_cache: pools of pages in
    `cache_layout` with a page where the layout has its batch entry ("bshd": [pages, page_size,
    h_kv, d]; "sbhd": [page_size, pages, h_kv, d]); page_table_k / page_table_v: int32 [b, pages a
    sequence], each entry a page of the pool; seq_len_kv: int32 [b], the tokens each sequence has.
    q in `layout` ("bshd", "sbhd", or "thd" with cu_seqlens_q and max_seqlen_q); seq_len_q defaults
    to full query rows. Decode is q with one token a sequence, bottom-right causal (the defaults)."""
    _require_one_cuda_device(q, k_cache, v_cache)
    batch, pages = page_table_k.shape
    cu_kv = None
    if layout == "thd":
        if cu_seqlens_q is None or max_seqlen_q <= 0:
            raise invalid_argument("cu_seqlens_q", cu_seqlens_q, "cu_seqlens_q and max_seqlen_q with thd")
        cu_kv = torch.nn.functional.pad(seq_len_kv.cumsum(0, dtype=torch.int32), (1, 0))
        seq_len_q = seq_len_kv  # unused: the ragged arrays carry both lengths
    # Without seq_len_q the core takes every sequence's s_q queries: no array to fill each call.
    config = _config_text(layout, cache_layout, causal, tuple(window), align, False, False, "vanilla", 0.0, False, True,
                          "", False, pages)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    extras = _Extras(cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_kv, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                     page_table_k=page_table_k, page_table_v=page_table_v)
    return _attend(q, k_cache, v_cache, None, None, extras, config, scale, max_seqlen_q, 0, False)[0]


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


# --- what the adapter checks itself: what never reaches the core -------------------------------

def _require_one_cuda_device(q, k, v):
    """The core sees addresses, not devices: the tensors must share one GPU (or meta, for tracing)."""
    if q.device.type not in ("cuda", "meta"):
        raise invalid_argument("q.device", q.device, "a CUDA device")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise invalid_argument(f"{name}.device", t.device, f"q's device, {q.device}")


@torch.compiler.assume_constant_result  # compiled code gets the text as a constant at trace time
def _config_text(layout, kv_layout, causal, window, align, bias_grad, alibi, softmax, dropout, deterministic, padding,
                 max_logit, stats, kv_pages, score_mod=""):
    """A call's config (no bias kind yet: the operator bodies take it from the bias's shape) in its
    printed form, which is how the operators carry it."""
    return _printed_config(layout, kv_layout, causal, window, align, bias_grad, alibi, softmax, dropout, deterministic,
                           padding, max_logit, stats, kv_pages, score_mod)


@functools.lru_cache(maxsize=4096)  # printed once per option set, not on every eager call
def _printed_config(layout, kv_layout, causal, window, align, bias_grad, alibi, softmax, dropout, deterministic,
                    padding, max_logit, stats, kv_pages, score_mod):
    return str(_config.config(layout, kv_layout, causal=causal, window=window, align=align, bias_grad=bias_grad,
                              alibi=alibi, softmax=softmax, dropout=dropout, deterministic=deterministic,
                              padding=padding, max_logit=max_logit, stats=stats, kv_pages=kv_pages,
                              score_mod=score_mod))


def _call_config(text, q, k, bias, extras, max_seqlen_q, max_seqlen_kv):
    """The Config an operator body runs: the call's, with the bias kind of `bias`'s shape."""
    config = _config.parse(text)
    if bias is None:
        return config
    return config.with_bias(_view(bias), _view(q), _view(k), extras.sequences(), max_seqlen_q, max_seqlen_kv)


@functools.lru_cache(maxsize=4096)
@functools.lru_cache(maxsize=4096)
def _plain_config_id(layout, causal, window, align, alibi, softmax, deterministic):
    """The registered id of a plain call's config, for the C++ path: one lookup per call, on
    positional arguments (a keyword call into the config's own cache costs twice as much)."""
    return _config.config(layout, causal=causal, window=window, align=align, alibi=alibi, softmax=softmax,
                          deterministic=deterministic).id


# --- tensors to the core's terms --------------------------------------------------------------

# Per dense layout, the tensor axis that holds each logical axis (batch, heads, sequence, head
# dim): output shapes only; the core describes the tensors themselves.
_AXES = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}


def _view(t: Tensor):
    """A tensor as the core takes it: (dtype name, sizes, strides)."""
    return str(t.dtype)[len("torch."):], tuple(t.shape), t.stride()


def _addr(t: Optional[Tensor]) -> int:
    return 0 if t is None or t.numel() == 0 else t.data_ptr()


class _Extras:
    """The tensors a call may carry beside q, k, v, bias and sink; none of them differentiable. They
    travel through the operators as one list in this order (mod_*: a score modifier's scalars and
    tensors)."""
    NAMES = ("rng", "cu_seqlens_q", "cu_seqlens_kv", "seq_len_q", "seq_len_kv", "page_table_k", "page_table_v",
             "mod_scalars", "mod_t0", "mod_t1", "mod_t2", "mod_t3")
    __slots__ = NAMES

    def __init__(self, **tensors):
        for name in self.NAMES:
            setattr(self, name, tensors.get(name))

    @classmethod
    def of(cls, tensors):
        return cls(**dict(zip(cls.NAMES, tensors)))

    def as_list(self):
        return [getattr(self, name) for name in self.NAMES]

    def sequences(self):
        return self.cu_seqlens_q.numel() - 1 if self.cu_seqlens_q is not None else (
            self.page_table_k.shape[0] if self.page_table_k is not None else 0)

    def addresses(self):
        """The tensor set's fields these fill, as device addresses (0 where absent)."""
        rng = self.rng
        out = dict(seq_len_q=_addr(self.seq_len_q), seq_len_kv=_addr(self.seq_len_kv),
                   cu_seqlens_q=_addr(self.cu_seqlens_q), cu_seqlens_kv=_addr(self.cu_seqlens_kv),
                   sequences=self.sequences() if self.cu_seqlens_q is not None else 0,
                   dropout_seed=_addr(rng), dropout_offset=_addr(rng) + rng.element_size() if rng is not None else 0)
        if self.mod_scalars is not None or self.mod_t0 is not None:
            out.update(score_mod_scalars=_addr(self.mod_scalars),
                       score_mod_tensors=[_addr(self.mod_t0), _addr(self.mod_t1), _addr(self.mod_t2), _addr(self.mod_t3)])
        return out


def _out_shape(q: Tensor, v: Tensor):
    return tuple(q.shape[:-1]) + (v.shape[-1],)


def _stats_shape(q: Tensor, layout: str):
    """float32 statistics: [b, h_q, s_q] for dense Q, [t, h_q] (by token) for ragged."""
    if layout == "thd":
        return tuple(q.shape[:2])
    axes = _AXES[layout]
    return q.shape[axes[0]], q.shape[axes[1]], q.shape[axes[2]]


def _max_logit_shape(q: Tensor, config):
    """float32 max logit: [b, h_q, s_q] per row, [h_q] per head; empty when not asked for."""
    if config.max_logit == "row":
        return _stats_shape(q, config.layout)
    if config.max_logit == "head":
        return (q.shape[1] if config.layout == "thd" else q.shape[_AXES[config.layout][1]],)
    return _EMPTY


_EMPTY = (0,)  # operators return an empty tensor for an output not asked for
_SAME_DEVICE = contextlib.nullcontext()


def _on_device(device):
    """Plans run on the device they were built for: make the tensors' device current if it is not."""
    return _SAME_DEVICE if device.index == torch._C._cuda_getDevice() else torch.cuda.device(device)


def _run(plan, tensors, scale, device):
    """Enqueues `plan` on the device's current stream with scratch memory from PyTorch's caching
    allocator (held until the work is enqueued)."""
    size = plan.workspace_bytes
    workspace = torch.empty(size, dtype=torch.uint8, device=device) if size else None
    plan.run(tensors, scale, torch._C._cuda_getCurrentRawStream(device.index), _addr(workspace), size)


# --- the operator bodies ------------------------------------------------------------------------

def _forward_body(q, k, v, bias, sink, extras, config_text, scale, max_seqlen_q, max_seqlen_kv):
    """O, the statistics and the max logit (None where the config asks for none)."""
    config = _call_config(config_text, q, k, bias, extras, max_seqlen_q, max_seqlen_kv)
    spec = config.spec(_view(q), _view(k), _view(v), extras.sequences(), max_seqlen_q, max_seqlen_kv)
    _torch_score_mod.check_tensors(spec, extras)
    with _on_device(q.device):
        o = q.new_empty(_out_shape(q, v))
        stats = q.new_empty(_stats_shape(q, config.layout), dtype=torch.float32) if spec.stats else None
        max_logit = q.new_empty(_max_logit_shape(q, config), dtype=torch.float32) if config.max_logit != "none" \
            else None
        tensors = core.ForwardTensors(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), stats=_addr(stats),
                                      max_logit=_addr(max_logit), bias=_addr(bias), sink=_addr(sink),
                                      page_table_k=_addr(extras.page_table_k), page_table_v=_addr(extras.page_table_v),
                                      **extras.addresses())
        _run(core.get_plan(spec, _config.FORWARD), tensors, scale, q.device)
    return o, stats, max_logit


def _backward_body(d_o, q, k, v, o, stats, bias, sink, extras, config_text, scale, max_seqlen_q, max_seqlen_kv):
    """dQ, dK, dV (with their inputs' strides: a view of a packed buffer gets a packed-strided
    gradient), dBias where the config asks for it, dSink with a sink (else None)."""
    config = _call_config(config_text, q, k, bias, extras, max_seqlen_q, max_seqlen_kv)
    spec = config.spec(_view(q), _view(k), _view(v), extras.sequences(), max_seqlen_q, max_seqlen_kv)
    _torch_score_mod.check_tensors(spec, extras)
    with _on_device(q.device):
        d_q, d_k, d_v = (torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device) for t in (q, k, v))
        d_bias = torch.empty_like(bias) if config.bias_grad else None
        d_sink = torch.empty_like(sink) if sink is not None else None
        d_o = d_o.contiguous()  # O's own layout, which the plan was built for
        tensors = core.BackwardTensors(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                                       d_o=d_o.data_ptr(), stats=stats.data_ptr(), d_q=d_q.data_ptr(),
                                       d_k=d_k.data_ptr(), d_v=d_v.data_ptr(), bias=_addr(bias), sink=_addr(sink),
                                       d_bias=_addr(d_bias), d_sink=_addr(d_sink), **extras.addresses())
        _run(core.get_plan(spec, _config.BACKWARD), tensors, scale, q.device)
    return d_q, d_k, d_v, d_bias, d_sink


def _eager_road(*tensors):
    """Road 2 of the module's docstring (the bodies directly): plain CUDA tensors (the first one's
    device decides), outside compiled code and dispatch modes. Otherwise road 3, the operators."""
    plain_tensors = all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)
    return (not torch.compiler.is_compiling() and tensors[0].device.type == "cuda" and plain_tensors
            and not torch._C._len_torch_dispatch_stack())


def _attend(q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv, needs_grad):
    """Roads 2 and 3 of the module's docstring: the bodies directly, or the registered operators."""
    if not _eager_road(q, k, v):
        o, stats, max_logit = _forward_op(q, k, v, bias, sink, extras.as_list(), config, scale, max_seqlen_q,
                                          max_seqlen_kv)
        return o, stats, max_logit
    if needs_grad:
        return _EagerAttention.apply(q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv)
    return _forward_body(q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv)


class _EagerAttention(torch.autograd.Function):
    """Eager training with the operator bodies, without the dispatcher's per-call cost."""

    @staticmethod
    def forward(ctx, q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv):
        o, stats, max_logit = _forward_body(q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv)
        ctx.save_for_backward(q, k, v, o, stats, bias, sink, *extras.as_list())  # rng: the forward's mask
        ctx.call = (config, scale, max_seqlen_q, max_seqlen_kv)
        if max_logit is not None:
            ctx.mark_non_differentiable(max_logit)
        ctx.mark_non_differentiable(stats)
        return o, stats, max_logit

    @staticmethod
    def backward(ctx, d_o, _d_stats, _d_max_logit):
        q, k, v, o, stats, bias, sink, *extras = ctx.saved_tensors
        d_q, d_k, d_v, d_bias, d_sink = _backward_body(d_o, q, k, v, o, stats, bias, sink, _Extras.of(extras),
                                                       *ctx.call)
        return d_q, d_k, d_v, d_bias, d_sink, None, None, None, None, None


# --- the registered operators (compiled code, meta tensors, subclasses, dispatch modes) ----------

@torch.library.custom_op("fusedattn::forward", mutates_args=())
def _forward_op(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], sink: Optional[Tensor],
                extras: List[Optional[Tensor]], config: str, scale: float, max_seqlen_q: int,
                max_seqlen_kv: int) -> Tuple[Tensor, Tensor, Tensor]:
    """`config` is the core Config's printed form: compiled programs may outlive this process."""
    o, stats, max_logit = _forward_body(q, k, v, bias, sink, _Extras.of(extras), config, scale, max_seqlen_q,
                                        max_seqlen_kv)
    return o, _or_empty(stats, q), _or_empty(max_logit, q)


def _check_while_tracing(q, k, v, bias, extras, config, max_seqlen_q, max_seqlen_kv):
    """Tracing (torch.compile, meta tensors) meets bad input as eager calls do: the core builds the
    spec from the fake tensors' sizes, where they are plain numbers (not symbolic)."""
    tensors = [t for t in (q, k, v, bias, *extras) if t is not None]
    if all(isinstance(n, int) for t in tensors for n in (*t.shape, *t.stride())):
        extras = _Extras.of(extras)
        spec = _call_config(config, q, k, bias, extras, max_seqlen_q, max_seqlen_kv).spec(
            _view(q), _view(k), _view(v), extras.sequences(), max_seqlen_q, max_seqlen_kv)
        _torch_score_mod.check_tensors(spec, extras)


@_forward_op.register_fake
def _(q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv):
    _check_while_tracing(q, k, v, bias, extras, config, max_seqlen_q, max_seqlen_kv)
    parsed = _config.parse(config)
    stats = q.new_empty(_stats_shape(q, parsed.layout) if parsed.stats else _EMPTY, dtype=torch.float32)
    return q.new_empty(_out_shape(q, v)), stats, q.new_empty(_max_logit_shape(q, parsed), dtype=torch.float32)


@torch.library.custom_op("fusedattn::backward", mutates_args=())
def _backward_op(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, stats: Tensor, bias: Optional[Tensor],
                 sink: Optional[Tensor], extras: List[Optional[Tensor]], config: str, scale: float,
                 max_seqlen_q: int, max_seqlen_kv: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    d_q, d_k, d_v, d_bias, d_sink = _backward_body(d_o, q, k, v, o, stats, bias, sink, _Extras.of(extras), config,
                                                   scale, max_seqlen_q, max_seqlen_kv)
    return d_q, d_k, d_v, _or_empty(d_bias, q), _or_empty(d_sink, q, torch.float32)


@_backward_op.register_fake
def _(d_o, q, k, v, o, stats, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv):
    grads = tuple(torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device) for t in (q, k, v))
    d_bias = torch.empty_like(bias) if _config.parse(config).bias_grad else q.new_empty(_EMPTY)
    d_sink = torch.empty_like(sink) if sink is not None else q.new_empty(_EMPTY, dtype=torch.float32)
    return grads + (d_bias, d_sink)


def _or_empty(t, like, dtype=torch.float32):
    return like.new_empty(_EMPTY, dtype=dtype) if t is None else t


def _setup_context(ctx, inputs, output):
    q, k, v, bias, sink, extras, config, scale, max_q, max_kv = inputs
    o, stats, _ = output
    ctx.save_for_backward(q, k, v, o, stats, bias, sink, *extras)
    ctx.call = (config, scale, max_q, max_kv)


def _operator_gradients(ctx, d_o, _d_stats, _d_max_logit):
    q, k, v, o, stats, bias, sink, *extras = ctx.saved_tensors
    config = ctx.call[0]
    d_q, d_k, d_v, d_bias, d_sink = _backward_op(d_o, q, k, v, o, stats, bias, sink, extras, *ctx.call)
    return (d_q, d_k, d_v, d_bias if _config.parse(config).bias_grad else None,
            d_sink if sink is not None else None, None, None, None, None, None)


torch.library.register_autograd("fusedattn::forward", _operator_gradients, setup_context=_setup_context)


from ._fp8 import Fp8State, fp8_attention  # noqa: E402  (it uses the helpers above)
from ._fp8_tensor import Fp8Tensor, fp8_quantize  # noqa: E402
from ._context_parallel import context_parallel_attention, load_balance, unbalance  # noqa: E402
