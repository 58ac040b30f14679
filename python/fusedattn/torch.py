"""fusedattn.torch — the PyTorch adapter.

It only translates: tensors become logical [b, h, s, d] descriptors (their real strides, so views
of packed buffers work as they are), options become a spec string, and the core does the rest
(validation, support answer, cached plan, execution). Registered as custom operators with fake
implementations, so torch.compile traces through without a graph break, and differentiable through
the core's backward.

    from fusedattn.torch import attention
    out = attention(q, k, v, layout="bshd", causal=True)           # q, k, v: [b, s, h, d]
    out = attention(q, k, v, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                    max_seqlen_q=m, max_seqlen_kv=m, causal=True)   # packed sequences: [t, h, d]
"""
import contextlib
import logging
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _core as core
from . import _layouts, _options
from .errors import NotSupportedError, invalid_argument

try:  # the eager-inference fast path in C++, built where PyTorch with CUDA was at build time
    from . import _torch_ops as _fast
except ImportError:
    _fast = None

__all__ = ["attention", "paged_attention", "scaled_dot_product_attention", "Attention"]

_LOG = logging.getLogger("fusedattn")
_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
_AXES = _layouts.AXES
# --- tensors to the core's terms -------------------------------------------------------------

def _logical(t: Tensor, layout: str, batch: int = 0, max_seq: int = 0):
    return _layouts.logical(t.shape, t.stride(), layout, batch, max_seq)


_desc = _layouts.desc


def _out_shape(q: Tensor, v: Tensor, layout: str):
    return tuple(q.shape[:-1]) + (v.shape[-1],)


def _max_logit_shape(q: Tensor, layout: str, options: str):
    """float32 max logit: [b, h_q, s_q] per row, [h_q] per head; nothing when not asked for."""
    if "max_logit=row" in options:
        return _stats_shape(q, layout)
    if "max_logit=head" in options:
        return (_logical(q, layout)[0][1],) if layout != "thd" else (q.shape[1],)
    return _EMPTY


def _stats_shape(q: Tensor, layout: str):
    """float32 statistics: [b, h_q, s_q] for dense Q, [t, h_q] (by token) for ragged."""
    if layout == "thd":
        return (q.shape[0], q.shape[1])
    dims, _ = _logical(q, layout)
    return (dims[0], dims[1], dims[2])


class _Entry:
    """A spec and its plans, cached per signature (shapes, strides, dtype, options)."""
    __slots__ = ("spec", "plans")

    def __init__(self, spec):
        self.spec, self.plans = spec, {}

    def plan(self, pass_):
        found = self.plans.get(pass_)
        if found is None:
            found = self.plans[pass_] = core.get_plan(self.spec, pass_)
        return found


_ENTRIES = {}


def _cached(key, dtype, tensors, options):
    """The entry for `key`, made on first use from `tensors()` (q, k, v, o as logical (dims,
    strides)) and the spec string's options; later calls cost one dictionary lookup."""
    found = _ENTRIES.get(key)
    if found is None:
        name = _DTYPES.get(dtype)
        if name is None:
            raise invalid_argument("q.dtype", dtype, "torch.float16 or torch.bfloat16")
        descs = " ".join(f"{tensor}={_desc(name, logical)}" for tensor, logical in zip("qkvo", tensors()))
        found = _ENTRIES[key] = _Entry(core.Spec.parse(f"{descs} {options}"))
    return found


def _entry(q, k, v, o, layout, options, batch, max_q, max_kv, want_stats):
    key = (q.device.index, layout, q.dtype, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), o.stride(),
           options, batch, max_q, max_kv, want_stats)
    return _cached(key, q.dtype, lambda: (_logical(q, layout, batch, max_q), _logical(k, layout, batch, max_kv),
                                          _logical(v, layout, batch, max_kv), _logical(o, layout, batch, max_q)),
                   f"{options} stats={int(want_stats)}")


def _addr(t: Optional[Tensor]) -> int:
    return 0 if t is None or t.numel() == 0 else t.data_ptr()


def _workspace(plan, device):
    """(address, bytes) of the plan's scratch memory, from PyTorch's caching allocator on the current
    stream; the tensor is returned too, to be held until the work is enqueued."""
    size = plan.workspace_bytes
    if size == 0:
        return None, 0, 0
    buffer = torch.empty(size, dtype=torch.uint8, device=device)
    return buffer, buffer.data_ptr(), size


def _stream(device) -> int:
    """The current stream of `device` as a cudaStream_t address (PyTorch's raw accessor: the
    Stream object that torch.cuda.current_stream() builds costs microseconds per call)."""
    return torch._C._cuda_getCurrentRawStream(device.index)


def _dropout_args(rng: Optional[Tensor]):
    """Dropout's Philox seed and offset: int64 [2] on the device, read by the kernels at run time."""
    if rng is None:
        return {}
    return {"dropout_seed": rng.data_ptr(), "dropout_offset": rng.data_ptr() + rng.element_size()}


def _ragged_args(cu_q: Optional[Tensor], cu_kv: Optional[Tensor]):
    if cu_q is None:
        return {}
    return {"sequences": cu_q.numel() - 1, "cu_seqlens_q": cu_q.data_ptr(), "cu_seqlens_kv": cu_kv.data_ptr()}


# --- the custom operators --------------------------------------------------------------------

_EMPTY = (0,)


_SAME_DEVICE = contextlib.nullcontext()


def _on_device(device):
    """Plans run on the device they were built for: make the tensors' device current if it is not."""
    return _SAME_DEVICE if device.index == torch._C._cuda_getDevice() else torch.cuda.device(device)


def _forward_extras(bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q, seq_len_kv, max_logit):
    """The optional addresses of a forward as keyword arguments; none at all in the plain case,
    which then costs no dictionary work."""
    if (bias is None and sink is None and rng is None and cu_seqlens_q is None and seq_len_q is None
            and max_logit is None):
        return _NO_EXTRAS
    return dict(bias=_addr(bias), sink=_addr(sink), seq_len_q=_addr(seq_len_q), seq_len_kv=_addr(seq_len_kv),
                max_logit=_addr(max_logit), **_dropout_args(rng), **_ragged_args(cu_seqlens_q, cu_seqlens_kv))


_NO_EXTRAS = {}


def _run_forward(q, k, v, bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q, seq_len_kv, layout, options,
                 scale, max_seqlen_q, max_seqlen_kv, want_stats, placeholders=True):
    """The forward operator's body. An operator returns tensors for outputs not asked for (empty
    placeholders); the eager fast path, which is no operator, skips them (placeholders=False)."""
    with _on_device(q.device):
        o = q.new_empty(_out_shape(q, v, layout))
        stats = q.new_empty(_stats_shape(q, layout), dtype=torch.float32) if want_stats else None
        max_logit_shape = _max_logit_shape(q, layout, options)
        max_logit = q.new_empty(max_logit_shape, dtype=torch.float32) if max_logit_shape != _EMPTY else None
        batch = cu_seqlens_q.numel() - 1 if cu_seqlens_q is not None else 0
        plan = _entry(q, k, v, o, layout, options, batch, max_seqlen_q, max_seqlen_kv, want_stats).plan("forward")
        _held, workspace, workspace_bytes = _workspace(plan, q.device)
        plan.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), _addr(stats), scale, _stream(q.device),
                     workspace, workspace_bytes,
                     **_forward_extras(bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q, seq_len_kv, max_logit))
    if placeholders:
        stats = q.new_empty(_EMPTY, dtype=torch.float32) if stats is None else stats
        max_logit = q.new_empty(_EMPTY, dtype=torch.float32) if max_logit is None else max_logit
    return o, stats, max_logit


@torch.library.custom_op("fusedattn::forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], sink: Optional[Tensor], rng: Optional[Tensor],
             cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor], seq_len_q: Optional[Tensor],
             seq_len_kv: Optional[Tensor], layout: str, options: str,
             scale: float, max_seqlen_q: int, max_seqlen_kv: int, want_stats: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return _run_forward(q, k, v, bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q, seq_len_kv, layout,
                        options, scale, max_seqlen_q, max_seqlen_kv, want_stats)


@_forward.register_fake
def _(q, k, v, bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q, seq_len_kv, layout, options, scale,
      max_seqlen_q, max_seqlen_kv, want_stats):
    return (q.new_empty(_out_shape(q, v, layout)),
            q.new_empty(_stats_shape(q, layout) if want_stats else _EMPTY, dtype=torch.float32),
            q.new_empty(_max_logit_shape(q, layout, options), dtype=torch.float32))


@torch.library.custom_op("fusedattn::backward", mutates_args=())
def _backward(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, stats: Tensor, bias: Optional[Tensor],
              sink: Optional[Tensor], rng: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
              cu_seqlens_kv: Optional[Tensor], seq_len_q: Optional[Tensor], seq_len_kv: Optional[Tensor], layout: str,
              options: str, scale: float, max_seqlen_q: int, max_seqlen_kv: int,
              bias_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _backward_body(d_o, q, k, v, o, stats, bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q, seq_len_kv,
                          layout, options, scale, max_seqlen_q, max_seqlen_kv, bias_grad)


def _backward_body(d_o, q, k, v, o, stats, bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q, seq_len_kv,
                   layout, options, scale, max_seqlen_q, max_seqlen_kv, bias_grad):
    with _on_device(q.device):
        return _enqueue_backward(d_o, q, k, v, o, stats, bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q,
                                 seq_len_kv, layout, options, scale, max_seqlen_q, max_seqlen_kv, bias_grad)


def _enqueue_backward(d_o, q, k, v, o, stats, bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q,
                      seq_len_kv, layout, options, scale, max_seqlen_q, max_seqlen_kv, bias_grad):
    # Gradients take their inputs' strides (a view of a packed buffer gets a packed-strided one).
    d_q, d_k, d_v = (torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device) for t in (q, k, v))
    d_bias = torch.empty_like(bias) if bias_grad else q.new_empty(_EMPTY)
    d_sink = torch.empty_like(sink) if sink is not None else q.new_empty(_EMPTY, dtype=torch.float32)
    d_o = d_o.contiguous()  # O's own layout, which the plan was built for
    batch = cu_seqlens_q.numel() - 1 if cu_seqlens_q is not None else 0
    grad_options = options + (" bias_grad=1" if bias_grad else "")
    plan = _entry(q, k, v, o, layout, grad_options, batch, max_seqlen_q, max_seqlen_kv, True).plan("backward")
    _held, workspace, workspace_bytes = _workspace(plan, q.device)
    plan.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), d_o.data_ptr(), stats.data_ptr(),
                  d_q.data_ptr(), d_k.data_ptr(), d_v.data_ptr(), scale, _stream(q.device), workspace, workspace_bytes,
                  bias=_addr(bias), sink=_addr(sink), d_bias=_addr(d_bias), d_sink=_addr(d_sink),
                  seq_len_q=_addr(seq_len_q), seq_len_kv=_addr(seq_len_kv), **_dropout_args(rng),
                  **_ragged_args(cu_seqlens_q, cu_seqlens_kv))
    return d_q, d_k, d_v, d_bias, d_sink


@_backward.register_fake
def _(d_o, q, k, v, o, stats, bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q, seq_len_kv, layout,
      options, scale, max_seqlen_q, max_seqlen_kv, bias_grad):
    grads = tuple(torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device) for t in (q, k, v))
    d_bias = torch.empty_like(bias) if bias_grad else q.new_empty(_EMPTY)
    d_sink = torch.empty_like(sink) if sink is not None else q.new_empty(_EMPTY, dtype=torch.float32)
    return grads + (d_bias, d_sink)


def _setup_context(ctx, inputs, output):
    q, k, v, bias, sink, rng, cu_q, cu_kv, len_q, len_kv, layout, options, scale, max_q, max_kv, _ = inputs
    o, stats, _ = output
    ctx.save_for_backward(q, k, v, o, stats, bias, sink, rng, cu_q, cu_kv, len_q, len_kv)  # rng: the forward's mask
    ctx.meta = (layout, options, scale, max_q, max_kv, bias is not None and bias.requires_grad)


def _gradients(ctx, d_o, backward):
    q, k, v, o, stats, bias, sink, rng, cu_q, cu_kv, len_q, len_kv = ctx.saved_tensors
    layout, options, scale, max_q, max_kv, bias_grad = ctx.meta
    d_q, d_k, d_v, d_bias, d_sink = backward(d_o, q, k, v, o, stats, bias, sink, rng, cu_q, cu_kv, len_q, len_kv,
                                             layout, options, scale, max_q, max_kv, bias_grad)
    return (d_q, d_k, d_v, d_bias if bias_grad else None, d_sink if sink is not None else None) + (None,) * 11


def _grad(ctx, d_o, _d_stats, _d_max_logit):  # the operator's autograd formula (compiled graphs)
    return _gradients(ctx, d_o, _backward)


class _EagerAttention(torch.autograd.Function):
    """Eager training: the same forward and backward bodies as the operators, without the
    dispatcher's per-call cost (the registered operators serve torch.compile)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _run_forward(*inputs)
        _setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(output[1], output[2])
        return output

    @staticmethod
    def backward(ctx, d_o, _d_stats, _d_max_logit):
        return _gradients(ctx, d_o, _backward_body)


torch.library.register_autograd("fusedattn::forward", _grad, setup_context=_setup_context)


# --- paged caches (inference: forward only) --------------------------------------------------

@torch.library.custom_op("fusedattn::paged_forward", mutates_args=())
def _paged_forward(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table_k: Tensor, page_table_v: Tensor,
                   seq_len_q: Tensor, seq_len_kv: Tensor, cu_seqlens_q: Optional[Tensor],
                   cu_seqlens_kv: Optional[Tensor], layout: str, cache_layout: str, options: str, scale: float,
                   max_seqlen_q: int) -> Tensor:
    with _on_device(q.device):
        o = q.new_empty(_out_shape(q, v_cache, layout))
        entry = _paged_entry(q, k_cache, v_cache, o, page_table_k, layout, cache_layout, options, max_seqlen_q)
        plan = entry.plan("forward")
        _held, workspace, workspace_bytes = _workspace(plan, q.device)
        plan.forward(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), 0, scale, _stream(q.device),
                     workspace, workspace_bytes,
                     seq_len_q=seq_len_q.data_ptr(), seq_len_kv=seq_len_kv.data_ptr(),
                     page_table_k=page_table_k.data_ptr(), page_table_v=page_table_v.data_ptr(),
                     **_ragged_args(cu_seqlens_q, cu_seqlens_kv))
        return o


@_paged_forward.register_fake
def _(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_q, seq_len_kv, cu_seqlens_q, cu_seqlens_kv, layout,
      cache_layout, options, scale, max_seqlen_q):
    return q.new_empty(_out_shape(q, v_cache, layout))


def _paged_entry(q, k_cache, v_cache, o, page_table, layout, cache_layout, options, max_q):
    """The spec of a paged call: the pools as K and V ([pages, h_kv, page_size, d]), kv_pages the
    page table's width."""
    batch, pages_per_seq = page_table.shape
    key = (q.device.index, "paged", layout, cache_layout, q.dtype, q.shape, q.stride(), k_cache.shape,
           k_cache.stride(), v_cache.shape, v_cache.stride(), o.stride(), options, batch, pages_per_seq, max_q)
    return _cached(key, q.dtype, lambda: (_logical(q, layout, batch, max_q), _logical(k_cache, cache_layout),
                                          _logical(v_cache, cache_layout), _logical(o, layout, batch, max_q)),
                   f"{options} padding=1 stats=0 kv_pages={pages_per_seq}")


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
    if layout not in ("bshd", "sbhd", "thd") or cache_layout not in ("bshd", "sbhd"):
        raise invalid_argument("layout/cache_layout", f"{layout}/{cache_layout}",
                         "bshd, sbhd or thd for q; bshd or sbhd for the caches")
    window = (window[0], 0) if causal else window
    options = f"window={window[0]},{window[1]} align={align}"
    batch = page_table_k.shape[0]
    cu_kv = None
    if layout == "thd":
        if cu_seqlens_q is None or max_seqlen_q <= 0:
            raise invalid_argument("cu_seqlens_q", cu_seqlens_q,
                             "cu_seqlens_q and max_seqlen_q with thd")
        cu_kv = torch.nn.functional.pad(seq_len_kv.cumsum(0, dtype=torch.int32), (1, 0))
        seq_len_q = seq_len_kv  # unused: the ragged arrays carry both lengths
    elif seq_len_q is None:
        seq_len_q = torch.full((batch,), _logical(q, layout)[0][2], dtype=torch.int32, device=q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return _paged_forward(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_q, seq_len_kv, cu_seqlens_q, cu_kv,
                          layout, cache_layout, options, float(scale), max_seqlen_q)


# --- the functional API ----------------------------------------------------------------------

_OPTIONS = {}


def _option_text(key):
    """The spec string's options for a call's arguments, cached (a training loop repeats them);
    compiled code builds them directly, once, at trace time."""
    text = _OPTIONS.get(key)
    if text is None:
        text = _OPTIONS[key] = _options.options_text(*key)
    return text


_FAST_IDS = {}
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _option_key(causal, window, align, softmax, bias_kind, alibi, deterministic, runtime_lengths, dropout_p,
                max_logit):
    """A call's options as _options.options_text takes them; causal closes the window on the right."""
    return (window[0], 0 if causal else window[1], align, softmax, bias_kind, alibi, deterministic, runtime_lengths,
            float(dropout_p), max_logit)


def _fast_options_id(layout, causal, align, window, alibi, softmax, deterministic):
    """_fast's id for a call's layout and options, or -1 where it takes no such call (thd; past
    its cap), cached per argument set."""
    window = tuple(window)
    key = (layout, causal, align, window, alibi, softmax, deterministic)
    found = _FAST_IDS.get(key)
    if found is None:
        options = _option_key(causal, window, align, softmax, "none", alibi, deterministic, False, 0.0, "")
        found = _fast.options_id(layout, _option_text(options)) if layout in _AXES else -1
        _FAST_IDS[key] = found
    return found


_FALLBACK_LOGGED = set()


def attention(q: Tensor, k: Tensor, v: Tensor, *, layout: str = "bshd", causal: bool = False,
              align: str = "top_left", window: Tuple[int, int] = (-1, -1), scale: Optional[float] = None,
              bias: Optional[Tensor] = None, alibi: bool = False, softmax: str = "vanilla",
              sink: Optional[Tensor] = None, dropout_p: float = 0.0, deterministic: bool = False,
              cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_kv: Optional[Tensor] = None,
              max_seqlen_q: int = 0, max_seqlen_kv: int = 0, seq_len_q: Optional[Tensor] = None,
              seq_len_kv: Optional[Tensor] = None, return_stats: bool = False, return_max_logit: str = "",
              fallback: bool = False):
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

    Returns O in q's layout with d_v; with return_stats also the statistics (float32 [b, h_q, s_q],
    or [t, h_q] for thd), and with return_max_logit="row" / "head" also the max logit (float32
    [b, h_q, s_q] / [h_q]), in that order, as a tuple.

    Errors are fusedattn.errors classes. With fallback=True, a configuration fusedattn does not
    support (NotSupportedError, and nothing else) runs PyTorch's own attention instead, and the
    reason is logged once per configuration; a configuration PyTorch cannot compute the same way
    (ALiBi, sink or off-by-one softmax, lengths, thd, statistics or max logit) raises as before.
    """
    # Plain eager inference, the call whose host time matters most, goes straight to C++: no bias,
    # sink, dropout, lengths or extra outputs, not traced. _fast checks the tensors and gives back
    # NotImplemented where autograd, a subclass, a wrapper or a dispatch mode must see the call.
    if (_fast is not None and bias is None and sink is None and not dropout_p and seq_len_q is None
            and seq_len_kv is None and cu_seqlens_q is None and cu_seqlens_kv is None and softmax != "sink"
            and not return_stats and not return_max_logit and not fallback and not torch.compiler.is_compiling()):
        fast_id = (_FAST_IDS.get((layout, causal, align, window, alibi, softmax, deterministic))
                   if type(window) is tuple else None)  # a list is no dict key
        if fast_id is None:
            fast_id = _fast_options_id(layout, causal, align, window, alibi, softmax, deterministic)
        if fast_id >= 0:
            out = _fast.forward(q, k, v, fast_id, scale)
            if out is not NotImplemented:
                return out
    if layout != "thd" and layout not in _AXES:
        raise invalid_argument("layout", layout, "one of bshd, sbhd, bhsd, thd")
    # Checked once here, cheaply (every call pays for it): the core cannot see host pointers.
    device = q.device
    if device.type not in ("cuda", "meta"):
        raise invalid_argument("q.device", device, "a CUDA device")
    if k.dtype is not q.dtype or v.dtype is not q.dtype or k.device != device or v.device != device:
        name, t = ("k", k) if k.dtype is not q.dtype or k.device != device else ("v", v)
        raise invalid_argument(f"{name}.dtype/device", f"{t.dtype}/{t.device}",
                         f"q's ({q.dtype}/{device})")
    bias_kind = "none"
    if bias is not None:
        dims, _ = _logical(q, layout)
        bias_kind = _options.bias_kind(bias.shape, dims[0], dims[1], dims[2], _logical(k, layout)[0][2])
        bias = bias.contiguous()
    if (seq_len_q is None) != (seq_len_kv is None):
        raise invalid_argument("seq_len_q", seq_len_q, "seq_len_q and seq_len_kv together")
    if layout == "thd":
        if cu_seqlens_q is None or cu_seqlens_kv is None or max_seqlen_q <= 0 or max_seqlen_kv <= 0:
            raise invalid_argument("cu_seqlens_q", cu_seqlens_q,
                             "cu_seqlens_q, cu_seqlens_kv (int32 [n + 1]) and max_seqlen_q, max_seqlen_kv with thd")
    if return_max_logit not in ("", "row", "head"):
        raise invalid_argument("return_max_logit", return_max_logit, "'row', 'head' or ''")
    compiling = torch.compiler.is_compiling()
    option_key = _option_key(causal, window, align, softmax, bias_kind, alibi, deterministic,
                             layout == "thd" or seq_len_q is not None, dropout_p, return_max_logit)
    option_text = _options.options_text(*option_key) if compiling else _option_text(option_key)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    try:
        # Dropout's seed and offset are drawn on the device by PyTorch's own CUDA generator, so a
        # replayed CUDA graph draws fresh ones, and the same generator state (torch.manual_seed)
        # gives the same mask again; the backward reuses the forward's pair.
        rng = None
        if dropout_p > 0.0:
            rng = torch.randint(0, 2 ** 62, (2,), device=q.device, dtype=torch.int64)
        needs_grad = torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad or (bias is not None and bias.requires_grad)
            or (sink is not None and sink.requires_grad))
        # Eager calls skip the dispatcher, which costs more than everything else per call:
        # inference calls the operator's body directly (the plain case went to _torch_ops above),
        # training an autograd.Function around the same bodies. Compiled code, meta tensors,
        # tensor subclasses (FakeTensor among them) and calls under a dispatch mode go through the
        # registered operators, so that whatever is watching sees fusedattn's operator.
        args = (q, k, v, bias, sink, rng, cu_seqlens_q, cu_seqlens_kv, seq_len_q, seq_len_kv, layout, option_text,
                float(scale), max_seqlen_q, max_seqlen_kv, bool(needs_grad or return_stats))
        if (compiling or device.type != "cuda" or torch._C._len_torch_dispatch_stack()
                or not (type(q) in _PLAIN_TENSORS and type(k) in _PLAIN_TENSORS and type(v) in _PLAIN_TENSORS)):
            o, stats, max_logit = _forward(*args)
        elif needs_grad:
            o, stats, max_logit = _EagerAttention.apply(*args)
        else:
            o, stats, max_logit = _run_forward(*args, placeholders=False)
    except NotSupportedError as error:
        # PyTorch's attention reproduces masks, windows, a bias and dropout, but not ALiBi, the
        # other softmax variants, runtime lengths, ragged inputs or the extra outputs.
        if (not fallback or layout == "thd" or return_stats or return_max_logit or seq_len_q is not None or alibi
                or softmax != "vanilla"):
            raise
        key = (layout, option_text, q.dtype, q.shape, k.shape)
        if key not in _FALLBACK_LOGGED:
            _FALLBACK_LOGGED.add(key)
            _LOG.warning("fusedattn: falling back to torch.nn.functional.scaled_dot_product_attention: %s", error)
        return _torch_fallback(q, k, v, layout, option_key[0], option_key[1], align, scale, bias, dropout_p)
    extra = ((stats,) if return_stats else ()) + ((max_logit,) if return_max_logit else ())
    return (o,) + extra if extra else o


def _torch_fallback(q, k, v, layout, left, right, align, scale, bias, dropout_p):
    """PyTorch's own attention on [b, h, s, d] views, the result back in q's layout. The window
    (left, right; -1 open) is the core's: with the diagonal at p (row i, shifted by s_kv - s_q when
    bottom-right), keys p - left < j <= p + right are visible."""
    to_bhsd = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}[layout]
    qb, kb, vb = (t.permute(*to_bhsd) for t in (q, k, v))
    mask = bias
    # SDPA's own is_causal is top-left causal without a mask; anything else becomes the mask.
    causal = bias is None and left < 0 and right == 0 and align == "top_left"
    if (left >= 0 or right >= 0) and not causal:
        s_q, s_kv = qb.shape[2], kb.shape[2]
        p = torch.arange(s_q, device=q.device)[:, None] + (s_kv - s_q if align == "bottom_right" else 0)
        j = torch.arange(s_kv, device=q.device)[None, :]
        keep = torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device)
        if left >= 0:
            keep &= j > p - left
        if right >= 0:
            keep &= j <= p + right
        mask = keep if bias is None else bias.masked_fill(~keep, float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(
        qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=scale,
        enable_gqa=qb.shape[1] != kb.shape[1])
    back = [0, 0, 0, 0]
    for logical, axis in enumerate(to_bhsd):
        back[axis] = logical
    return out.permute(*back)


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
