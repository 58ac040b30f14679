"""fusedattn.torch's FP8 attention: the scaling recipes and the operator bodies around cuDNN's FP8
kernels (fusedattn/fp8_scales.h).

    state = fusedattn.torch.Fp8State(recipe="delayed", history=16)   # one per attention layer
    out = fusedattn.torch.fp8_attention(q, k, v, state, causal=True)  # q, k, v: bf16 or f16 [b, s, h, d]

The inputs stay in model precision: each is quantized inside, in one fused pass (fusedattn's
quantize kernel), and O and the gradients come back in q's dtype. Where each scale comes from:
  - Q, K, V (and dO in the backward): recipe "current" measures this call's amax before quantizing;
    "delayed" quantizes with the scale from the tensor's amax history, records the amax it saw in
    the same pass, and then updates the history and the scale for the next call.
  - S, the probabilities: fixed at the format's largest value (they are at most 1).
  - O: from V's amax (O is an average of V's rows, so it never exceeds it: no saturation).
  - dP, dQ, dK, dV (written by the kernels, so they cannot be measured first): delayed scaling from
    the amaxes the kernels report, with two bits of headroom, under both recipes; a state's first
    backward runs twice, the first time to measure them.
The backward undoes the scales its saved FP8 tensors were made with (copied at the forward), so
several forwards may run before their backwards. Fp8State(grad_dtype=torch.float8_e5m2) beside E4M3
is the hybrid recipe: dO, dP and the gradients in E5M2 (their scales from E5M2's largest value).
backward="model" runs the backward in model precision (fusedattn's BF16/FP16 kernels) on the
unquantized inputs, with the FP8 forward's O and statistics.
Inputs already in FP8 (the state's dtype) come with their descales and run the forward only
(_fp8_inputs_forward_body; the operator fusedattn::fp8_inputs_forward for compiled code):
    o = fusedattn.torch.fp8_attention(q8, k8, v8, state, descales=(dq, dk, dv))   # O in bf16
As Fp8Tensors (_torch_fp8_tensor.py: the payload and its descale under a bf16 or f16 tensor) they
are differentiable: the same forward, and the backward above, with gradients of their values.

Every scale, amax and history lives in one device buffer of the state, so a step captured in a
CUDA graph replays with the values of each step. The operator bodies below take that buffer as a
tensor and find their slots in it (_Scaling), so the two roads of torch.py's docstring that are not
C++ run the same bodies: eager calls through _Fp8Attention, and compiled code, meta tensors and
dispatch modes through the operators fusedattn::fp8_forward / fusedattn::fp8_backward
(_torch_fp8_ops.py), which mutate the buffer.

Calls through the operators and the state's `calibrated` flag (whether its first backward has
measured the kernel-written amaxes): an operator cannot reach the Python state, so such a call
reads the flag at its forward and hands it to its backward as a constant (in compiled code Dynamo
guards on it), and a call that will have an FP8 backward sets it then, since that backward
measures. A program compiled on a fresh state therefore compiles once more on its second call, and
from then on its backwards run once. Unlike eager calls, which read the flag at the backward, a
fresh state's second forward made before the first backward has run counts as calibrated: its
backward, if it runs first, runs once with the initial scales of dP and the gradients.
Under AOTAutograd (backends aot_eager and inductor) PyTorch 2.11 checks the version of the state's
buffer at a compiled call's backward, so another forward on the same state before that backward
raises autograd's "modified by an inplace operation"; eager calls take any order.
"""
import functools
import math

import torch

from .. import _config
from .. import _fp8_recipe as _recipe
from .. import _core as core
from .. import torch as _adapter
from ._fp8_tensor import Fp8Tensor
from ..errors import invalid_argument

__all__ = ["Fp8State", "fp8_attention"]

# --- the state's buffer: the one place of its layout -----------------------------------------------

_TENSORS, _SLOT, _KERNEL_WRITTEN = _recipe.TENSORS, _recipe.SLOT, _recipe.KERNEL_WRITTEN
_DTYPES = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_BY_NAME = {name: dtype for dtype, name in _DTYPES.items()}
# Each format's (forward dtype, gradients' dtype), by the name the operators carry (_fp8_recipe.py).
_FORMATS = {name: (_BY_NAME[a], _BY_NAME[b]) for name, (a, b) in _recipe.FORMATS.items()}


def _buffer_size(history):
    """[n, 3] scale, descale, amax; then [n, history] amax histories."""
    return len(_TENSORS) * (3 + history)


def _split(buffer):
    """The buffer's scalars [n, 3] and histories [n, history] (the history length is its size's)."""
    n = len(_TENSORS)
    return buffer[:n * 3].view(n, 3), buffer[n * 3:].view(n, buffer.numel() // n - 3)


class Fp8State:
    """The scaling state of one attention layer: scales, descales, amaxes and (delayed scaling)
    amax histories, in one float32 device buffer. recipe: "current" or "delayed"; history: the
    delayed recipe's amax history length; margin: scales are divided by 2^margin; dtype:
    torch.float8_e4m3fn or torch.float8_e5m2; grad_dtype: the FP8 backward's dO and gradients,
    dtype's by default, or torch.float8_e5m2 beside E4M3 (the hybrid recipe); device: a CUDA device
    (default the current one), or "meta" for tracing without a GPU."""

    def __init__(self, recipe="delayed", *, history=16, margin=0, dtype=torch.float8_e4m3fn, grad_dtype=None,
                 device=None):
        _recipe.require_recipe(recipe)
        if dtype not in _DTYPES:
            raise invalid_argument("dtype", dtype, "torch.float8_e4m3fn or torch.float8_e5m2")
        grad_dtype = dtype if grad_dtype is None else grad_dtype
        self.name = _recipe.format_name(_DTYPES[dtype], _DTYPES.get(grad_dtype))
        if self.name is None:
            raise invalid_argument("grad_dtype", grad_dtype,
                                   "torch.float8_e5m2 beside torch.float8_e4m3fn (the hybrid recipe), or dtype")
        _recipe.require_history(history)
        self.recipe, self.history, self.margin, self.dtype = recipe, int(history), int(margin), dtype
        self.grad_dtype = grad_dtype
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self.buffer = torch.zeros(_buffer_size(self.history), dtype=torch.float32, device=device)
        self.scalars, self.histories = _split(self.buffer)
        self.scalars[:, :2] = 1.0  # scales start at 1
        largest = core.fp8_max(_DTYPES[dtype])
        self.scalars[_SLOT["s"], 0], self.scalars[_SLOT["s"], 1] = largest, 1.0 / largest
        self.calibrated = False  # the kernel-written tensors' scales have been measured once


class _Scaling:
    """A state's buffer as the operator bodies see it: its slots' device addresses and the recipes'
    steps, enqueued on the current stream. CUDA only (it takes addresses)."""

    def __init__(self, buffer, recipe, margin, name):
        self.scalars, self.histories = _split(buffer)
        self.recipe, self.margin, self.name = recipe, margin, name
        self.dtype, self.grad_dtype = _FORMATS[name]
        self.history = self.histories.shape[1]
        self.device = buffer.device

    def _at(self, name, part):
        return self.scalars[_SLOT[name], part].data_ptr()

    def scale(self, name):
        return self._at(name, 0)

    def descale(self, name):
        return self._at(name, 1)

    def amax(self, name):
        return self._at(name, 2)

    def _stream(self):
        return torch._C._cuda_getCurrentRawStream(self.device.index)

    def _dtype_name(self, name):
        return _recipe.dtype_name(name, self.name)

    def quantize(self, name, x):
        """x (model precision) in FP8, by the recipe; its scale and descale in the state."""
        dtype = _BY_NAME[self._dtype_name(name)]
        out = torch.empty_strided(x.size(), x.stride(), dtype=dtype, device=x.device)
        stream = self._stream()
        if self.recipe == "current":
            core.measure_amax(_adapter._view(x), x.data_ptr(), self.amax(name), stream)
            self.set_from_amax(name)
            core.quantize_fp8(_adapter._view(x), x.data_ptr(), _adapter._view(out), out.data_ptr(), self.scale(name), 0,
                              stream)
        else:
            core.quantize_fp8(_adapter._view(x), x.data_ptr(), _adapter._view(out), out.data_ptr(), self.scale(name),
                              self.amax(name), stream)
        return out

    def set_from_amax(self, name, source=None):
        """Current scaling of `name` from the amax of `source` (default: its own)."""
        core.scale_from_amax(self.amax(source or name), self._dtype_name(name), self.margin, self.scale(name),
                             self.descale(name), self._stream())

    def advance(self, names):
        """Delayed scaling's step for `names`: each history takes its amax, and the scale follows."""
        stream = self._stream()
        for name in names:
            history = self.histories[_SLOT[name]].data_ptr()
            core.update_delayed_scaling(history, history, self.history, self.amax(name), self._dtype_name(name),
                                        _recipe.margin_of(name, self.margin),
                                        self.scale(name), self.descale(name), stream)

    def used_descales(self):
        """This call's descales of Q, K, V and O, copied: the state's own move on with the next
        forward (or, under delayed scaling, right after this one), but the backward must undo the
        scales its saved FP8 tensors were made with. Views and one cat, no index list: a list
        would be copied from the host, which a CUDA graph capture refuses."""
        return torch.cat([self.scalars[_SLOT[n], 1:2] for n in ("q", "k", "v", "o")])


def _dequantized(x8, descale, dtype):
    out = torch.empty_strided(x8.size(), x8.stride(), dtype=dtype, device=x8.device)
    core.dequantize_fp8(_adapter._view(x8), x8.data_ptr(), _adapter._view(out), out.data_ptr(), descale,
                        torch._C._cuda_getCurrentRawStream(x8.device.index))
    return out


# --- the operator bodies (eager and compiled code alike) -------------------------------------------

def _kernel_forward(state, config, q8, k8, v8, descales, scale):
    """cuDNN's FP8 forward of q8, k8, v8 with their descales (device addresses): (o8, the statistics).
    O's scale is set from V's amax in the state first (|O| <= max |V|); the kernel writes the amaxes
    of S and O there."""
    state.set_from_amax("o", source="v")
    spec = config.spec(_adapter._view(q8), _adapter._view(k8), _adapter._view(v8), 0, 0, 0)
    with _adapter._on_device(q8.device):
        o8 = torch.empty(_adapter._out_shape(q8, v8), dtype=state.dtype, device=q8.device)
        stats = torch.empty(_adapter._stats_shape(q8, config.layout), dtype=torch.float32, device=q8.device)
        descale_q, descale_k, descale_v = descales
        tensors = core.ForwardTensors(q=q8.data_ptr(), k=k8.data_ptr(), v=v8.data_ptr(), o=o8.data_ptr(),
                                      stats=stats.data_ptr(), descale_q=descale_q, descale_k=descale_k,
                                      descale_v=descale_v, descale_s=state.descale("s"), scale_s=state.scale("s"),
                                      scale_o=state.scale("o"), amax_s=state.amax("s"), amax_o=state.amax("o"))
        _adapter._run(core.get_plan(spec, _config.FORWARD), tensors, scale, q8.device)
    return o8, stats


def _forward_body(q, k, v, buffer, config_text, scale, recipe, margin, fp8_name):
    """O in q's dtype, the FP8 tensors the backward takes (q8, k8, v8, o8), the statistics and the
    descales of Q, K, V and O this call used. Updates the state in `buffer`."""
    state, config = _Scaling(buffer, recipe, margin, fp8_name), _config.parse(config_text)
    q8, k8, v8 = state.quantize("q", q), state.quantize("k", k), state.quantize("v", v)
    o8, stats = _kernel_forward(state, config, q8, k8, v8, [state.descale(n) for n in "qkv"], scale)
    with _adapter._on_device(q.device):
        o = _dequantized(o8, state.descale("o"), q.dtype)
        used = state.used_descales()
    if state.recipe == "delayed":
        state.advance(("q", "k", "v"))
    return o, q8, k8, v8, o8, stats, used


def _fp8_inputs_forward_body(q8, k8, v8, descale_q, descale_k, descale_v, buffer, config_text, scale, recipe, margin,
                             fp8_name, out_dtype):
    """Inputs already in FP8, with their descales (float32 one-element tensors): (o8, O in out_dtype,
    the statistics, the descales of Q, K, V and O [4]); O in out_dtype is empty where out_dtype is
    the state's FP8 dtype (o8 is that O). O's scale comes from V's amax, measured here (max |V|
    bounds |O|). Updates the state's slots of V (its amax) and O in `buffer`; Q's, K's and V's scales
    are the caller's."""
    state, config = _Scaling(buffer, recipe, margin, fp8_name), _config.parse(config_text)
    stream = state._stream()
    core.measure_amax(_adapter._view(v8), v8.data_ptr(), state.amax("v"), stream)  # of the stored values
    state.scalars[_SLOT["v"], 2].mul_(descale_v.reshape(()))
    descales = (descale_q, descale_k, descale_v)
    o8, stats = _kernel_forward(state, config, q8, k8, v8, [d.data_ptr() for d in descales], scale)
    with _adapter._on_device(q8.device):
        used = torch.cat([d.reshape(1) for d in descales] + [state.scalars[_SLOT["o"], 1:2]])
        o = o8.new_empty(0) if out_dtype == state.dtype else _dequantized(o8, state.descale("o"), out_dtype)
    return o8, o, stats, used


def _backward_body(d_o, q8, k8, v8, o8, stats, used, like, buffer, config_text, scale, recipe, margin, fp8_name,
                   calibrated):
    """dQ, dK, dV in like's dtype from cuDNN's FP8 backward, with the descales `used` of the forward
    that made q8, k8, v8, o8. Not `calibrated`: the backward runs twice, the first run to measure the
    kernel-written tensors' amaxes. Updates the state in `buffer`."""
    state, config = _Scaling(buffer, recipe, margin, fp8_name), _config.parse(config_text)
    descale_q, descale_k, descale_v, descale_o = (used[i].data_ptr() for i in range(4))
    d_o8 = state.quantize("d_o", d_o.contiguous())
    spec = config.spec(_adapter._view(q8), _adapter._view(k8), _adapter._view(v8), 0, 0, 0)
    with _adapter._on_device(q8.device):
        grads8 = [torch.empty_strided(t.size(), t.stride(), dtype=state.grad_dtype, device=t.device)
                  for t in (q8, k8, v8)]
        tensors = core.BackwardTensors(
            q=q8.data_ptr(), k=k8.data_ptr(), v=v8.data_ptr(), o=o8.data_ptr(), d_o=d_o8.data_ptr(),
            stats=stats.data_ptr(), d_q=grads8[0].data_ptr(), d_k=grads8[1].data_ptr(), d_v=grads8[2].data_ptr(),
            descale_q=descale_q, descale_k=descale_k, descale_v=descale_v, descale_o=descale_o,
            descale_d_o=state.descale("d_o"), descale_s=state.descale("s"),
            descale_d_p=state.descale("d_p"), scale_s=state.scale("s"), scale_d_p=state.scale("d_p"),
            scale_d_q=state.scale("d_q"), scale_d_k=state.scale("d_k"), scale_d_v=state.scale("d_v"),
            amax_d_q=state.amax("d_q"), amax_d_k=state.amax("d_k"), amax_d_v=state.amax("d_v"),
            amax_d_p=state.amax("d_p"))
        plan = core.get_plan(spec, _config.BACKWARD)
        # A state's first backward measures the kernel-written tensors' amaxes, then runs again
        # with scales from them. The gradients are dequantized with the descales their run used,
        # before the step moves the scales on.
        for run in range(1 if calibrated else 2):
            if run:
                state.advance(_KERNEL_WRITTEN)
            _adapter._run(plan, tensors, scale, q8.device)
        grads = [_dequantized(g8, state.descale(name), like.dtype) for g8, name in zip(grads8, ("d_q", "d_k", "d_v"))]
        state.advance(_recipe.moved_after_backward(state.recipe))
    return grads[0], grads[1], grads[2]


def _model_backward(d_o, q, k, v, o, stats, config_text, scale):
    """backward="model": fusedattn's BF16/FP16 backward on the unquantized inputs (the config's spec
    on these is the model-precision one)."""
    d_q, d_k, d_v, _, _ = _adapter._backward_body(d_o, q, k, v, o, stats, None, None, _adapter._Extras(), config_text,
                                                  scale, 0, 0)
    return d_q, d_k, d_v


class _Fp8Attention(torch.autograd.Function):
    """Eager calls: the bodies directly, without the dispatcher."""

    @staticmethod
    def forward(ctx, q, k, v, state, config_text, scale, model_backward):
        o, q8, k8, v8, o8, stats, used = _forward_body(q, k, v, state.buffer, config_text, scale, state.recipe,
                                                       state.margin, state.name)
        ctx.state, ctx.config, ctx.scale, ctx.model_backward = state, config_text, scale, model_backward
        saved = (q, k, v, o, stats) if model_backward else (q8, k8, v8, o8, stats, used, q)
        ctx.save_for_backward(*saved)
        return o

    @staticmethod
    def backward(ctx, d_o):
        state = ctx.state
        if ctx.model_backward:
            d_q, d_k, d_v = _model_backward(d_o, *ctx.saved_tensors, ctx.config, ctx.scale)
        else:
            d_q, d_k, d_v = _backward_body(d_o, *ctx.saved_tensors, state.buffer, ctx.config, ctx.scale, state.recipe,
                                           state.margin, state.name, state.calibrated)
            state.calibrated = True
        return d_q, d_k, d_v, None, None, None, None


class _Fp8TensorAttention(_Fp8Attention):
    """Eager calls of Fp8Tensors: the FP8-input body on their payloads and descales, saving what
    _Fp8Attention's backward takes (its gradients are the values', in the Fp8Tensors' dtype;
    backward="model" runs on the dequantized values)."""

    @staticmethod
    def forward(ctx, q, k, v, state, config_text, scale, model_backward):
        o8, o, stats, used = _fp8_inputs_forward_body(q.data8, k.data8, v.data8, q.descale, k.descale, v.descale,
                                                      state.buffer, config_text, scale, state.recipe, state.margin,
                                                      state.name, q.dtype)
        ctx.state, ctx.config, ctx.scale, ctx.model_backward = state, config_text, scale, model_backward
        if model_backward:
            values = [_dequantized(t.data8, t.descale.data_ptr(), q.dtype) for t in (q, k, v)]
            ctx.save_for_backward(*values, o, stats)
        else:
            ctx.save_for_backward(q.data8, k.data8, v.data8, o8, stats, used, o)  # o: the gradients' dtype
        return o


# --- the front door: validation, then road 2 (eager) or road 3 (the operators) ---------------------

@torch.compiler.assume_constant_result  # compiled code gets the text as a constant at trace time
def _config_text(layout, causal, window, align, fp8_grads):
    return _printed_config(layout, causal, window, align, fp8_grads)


@functools.lru_cache(maxsize=4096)  # printed once per option set, not on every eager call
def _printed_config(layout, causal, window, align, fp8_grads):
    return str(_config.config(layout, causal=causal, window=window, align=align, fp8_grads=fp8_grads))


def _require_descales(descales, q):
    if not (isinstance(descales, (tuple, list)) and len(descales) == 3):
        raise invalid_argument("descales", type(descales).__name__,
                               "(descale_q, descale_k, descale_v) for FP8 inputs: float32 one-element tensors")
    for name, t in zip(("descale_q", "descale_k", "descale_v"), descales):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1 or t.device != q.device:
            shown = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise invalid_argument(f"descales.{name}", shown, f"a float32 one-element tensor on {q.device}")


def _fp8_inputs_attention(q, k, v, state, descales, config_text, scale, out_dtype):
    """fp8_attention of inputs already in FP8: forward only."""
    for name, t in zip("qkv", (q, k, v)):
        if t.dtype != state.dtype:
            raise invalid_argument(f"{name}.dtype", t.dtype, f"{state.dtype}, the state's format, for every input")
        if t.requires_grad:
            raise invalid_argument(f"{name}.requires_grad", True,
                                   "False: a plain FP8 tensor's gradient would be FP8 without a scale (wrap the "
                                   "inputs as fusedattn.torch.Fp8Tensor for a backward)")
    _require_descales(descales, q)
    if out_dtype not in (torch.bfloat16, torch.float16, state.dtype):
        raise invalid_argument("out_dtype", out_dtype, f"torch.bfloat16, torch.float16 or {state.dtype}")
    run = _fp8_inputs_forward_body if _adapter._eager_road(q, k, v, *descales) else _ops.fp8_inputs_forward
    o8, o, _, used = run(q, k, v, *descales, state.buffer, config_text, scale, state.recipe, state.margin, state.name,
                         out_dtype)
    return (o8, used[3:]) if out_dtype == state.dtype else o


def _fp8_tensor_attention(q, k, v, state, descales, config_text, scale, out_dtype, model_backward):
    """fp8_attention of Fp8Tensors: O in their dtype, differentiable with respect to their values."""
    for name, t in zip("qkv", (q, k, v)):
        if not isinstance(t, Fp8Tensor):
            raise invalid_argument(f"{name}", type(t).__name__, "a fusedattn.torch.Fp8Tensor, as q is")
        if t.data8.dtype != state.dtype:
            raise invalid_argument(f"{name}.data8.dtype", t.data8.dtype, f"{state.dtype}, the state's format")
        if t.dtype != q.dtype:
            raise invalid_argument(f"{name}.dtype", t.dtype, f"{q.dtype}, q's")
    if descales is not None:
        raise invalid_argument("descales", "given", "not given for Fp8Tensors (each carries its descale)")
    if out_dtype not in (None, q.dtype):
        raise invalid_argument("out_dtype", out_dtype, f"{q.dtype}, the Fp8Tensors' dtype, or not given")
    if _adapter._eager_road(q.data8, k.data8, v.data8):
        return _Fp8TensorAttention.apply(q, k, v, state, config_text, scale, model_backward)
    return _through_operators(_ops.fp8_tensor_attention, q, k, v, state, config_text, scale, model_backward)


def _through_operators(operator, q, k, v, state, config_text, scale, model_backward):
    """Road 3: `operator` (_ops.attention or _ops.fp8_tensor_attention) with the state's calibration
    flag as this call sees it; a call whose FP8 backward will run sets it, since that backward
    measures (the module's docstring)."""
    calibrated = state.calibrated
    if not model_backward and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        state.calibrated = True
    return operator(q, k, v, state.buffer, config_text, scale, state.recipe, state.margin, state.name, model_backward,
                    calibrated)


def fp8_attention(q, k, v, state, *, layout="bshd", causal=False, align="top_left", window=(-1, -1), scale=None,
                  backward="fp8", descales=None, out_dtype=None):
    """FP8 attention of q, k, v (bf16 or f16 in `layout`, dense: "bshd", "sbhd" or "bhsd") with the
    scaling `state` (Fp8State); returns O in q's dtype. causal, window and align as in attention().
    backward: "fp8" (cuDNN's FP8 backward) or "model" (the backward in q's dtype). What cuDNN's FP8
    kernels do not take on this GPU raises NotSupportedError with every reason (on Hopper: head dim
    128 for the backward, no bottom-right diagonal, no bias). torch.compile traces it in one graph
    (the module's docstring says how compiled code treats the state's calibration).

    Inputs already in FP8 (the state's dtype, for example from an FP8 projection or cache) come with
    descales=(descale_q, descale_k, descale_v), float32 one-element tensors (x = x8 * descale), and
    run the forward only. O comes back in out_dtype (default torch.bfloat16), or, with out_dtype the
    state's FP8 dtype, as (o8, descale_o). O's scale comes from V's amax, measured in the call.
    Wrapped as Fp8Tensors (which carry their descales) they also have a backward: O comes back in
    their dtype, and their gradients are their values', in that dtype."""
    if not isinstance(state, Fp8State):
        raise invalid_argument("state", type(state).__name__, "a fusedattn.torch.Fp8State")
    if backward not in ("fp8", "model"):
        raise invalid_argument("backward", backward, '"fp8" or "model"')
    _adapter._require_one_cuda_device(q, k, v)
    fp8_grads = _recipe.fp8_grads(state.name) if backward == "fp8" else ""  # the model backward has none
    config_text = _config_text(layout, causal, tuple(window), align, fp8_grads)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if isinstance(q, Fp8Tensor):
        return _fp8_tensor_attention(q, k, v, state, descales, config_text, scale, out_dtype, backward == "model")
    if q.dtype in _DTYPES:
        return _fp8_inputs_attention(q, k, v, state, descales, config_text, scale,
                                     torch.bfloat16 if out_dtype is None else out_dtype)
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise invalid_argument("q.dtype", q.dtype,
                               "torch.bfloat16 or torch.float16 (quantized inside), or the state's FP8 dtype with descales")
    if descales is not None or out_dtype not in (None, q.dtype):
        field = "descales" if descales is not None else "out_dtype"
        raise invalid_argument(field, "given", f"not given for {q.dtype} inputs (O comes back in q's dtype)")
    model_backward = backward == "model"
    if _adapter._eager_road(q, k, v):
        return _Fp8Attention.apply(q, k, v, state, config_text, scale, model_backward)
    return _through_operators(_ops.attention, q, k, v, state, config_text, scale, model_backward)


from . import _fp8_operators as _ops  # noqa: E402  (it registers the operators around the bodies above)
