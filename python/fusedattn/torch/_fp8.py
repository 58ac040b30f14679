"""fusedattn.torch's FP8 attention: fp8_attention, its checks, and the road each kind of input takes.

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
(_fp8_bodies.fp8_inputs_forward; the operator fusedattn::fp8_inputs_forward for compiled code):
    o = fusedattn.torch.fp8_attention(q8, k8, v8, state, descales=(dq, dk, dv))   # O in bf16
As Fp8Tensors (_fp8_tensor.py: the payload and its descale under a bf16 or f16 tensor) they are
differentiable: the same forward, and the backward above, with gradients of their values.

Every scale, amax and history lives in one device buffer of the state (_fp8_state.py), so a step
captured in a CUDA graph replays with the values of each step. The bodies (_fp8_bodies.py) take
that buffer as a tensor, so the two roads of fusedattn.torch's docstring that are not C++ run the
same bodies (_fp8_operators.py: eager autograd.Functions, and the registered operators, whose calls
see the state's calibration flag as that module's docstring says).
"""
import math

import torch

from .. import _config
from .. import _fp8_recipe as _recipe
from .._fp8_backward import require_backward
from ..errors import invalid_argument
from . import _fp8_operators
from ._bodies import require_one_cuda_device
from ._call_config import fp8_config_text
from ._fp8_auto import auto_backward
from ._fp8_state import DTYPES, Fp8State
from ._fp8_tensor import Fp8Tensor
from ._operators import eager_road


def fp8_attention(q, k, v, state, *, layout="bshd", causal=False, align="top_left", window=(-1, -1), scale=None,
                  backward="auto", descales=None, out_dtype=None, seq_len_q=None, seq_len_kv=None):
    """FP8 attention of q, k, v (bf16 or f16 in `layout`, dense: "bshd", "sbhd" or "bhsd") with the
    scaling `state` (Fp8State); returns O in q's dtype. causal, window and align as in attention().
    backward: "auto" (the faster of the two for this shape, measured once: _fp8_backward.py), "fp8"
    (cuDNN's FP8 backward) or "model" (the backward in q's dtype). What cuDNN's FP8
    kernels do not take on this GPU raises NotSupportedError with every reason (on Hopper: head dim
    128 for the backward, no bottom-right diagonal, no bias). torch.compile traces it in one graph
    (the module's docstring says how compiled code treats the state's calibration). seq_len_q and
    seq_len_kv (int32 [b], on q's device, together) make each entry's lengths runtime data, as in
    attention(): O and the gradients are zero past them (the amaxes are the whole tensors'), and
    backward="auto" chooses as for full lengths.

    Inputs already in FP8 (the state's dtype, for example from an FP8 projection or cache) come with
    descales=(descale_q, descale_k, descale_v), float32 one-element tensors (x = x8 * descale), and
    run the forward only. O comes back in out_dtype (default torch.bfloat16), or, with out_dtype the
    state's FP8 dtype, as (o8, descale_o). O's scale comes from V's amax, measured in the call.
    Wrapped as Fp8Tensors (which carry their descales) they also have a backward: O comes back in
    their dtype, and their gradients are their values', in that dtype."""
    if not isinstance(state, Fp8State):
        raise invalid_argument("state", type(state).__name__, "a fusedattn.torch.Fp8State")
    require_backward(backward)
    require_one_cuda_device(q, k, v, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
    _config.require_arrays(ragged=False, sink=None, softmax="vanilla", seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                           cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=0, max_seqlen_kv=0)
    lengths = dict(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
    if backward == "auto":
        # Inputs already in FP8 run the forward only: no backward to choose.
        plain_fp8 = q.dtype in DTYPES and not isinstance(q, Fp8Tensor)
        backward = "fp8" if plain_fp8 else auto_backward(q, k, v, state, layout=layout, causal=causal,
                                                           window=tuple(window), align=align)
    fp8_grads = _recipe.fp8_grads(state.name) if backward == "fp8" else ""  # the model backward has none
    config = fp8_config_text(layout=layout, causal=causal, window=tuple(window), align=align, fp8_grads=fp8_grads,
                             padding=seq_len_q is not None)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    model_backward = backward == "model"
    if isinstance(q, Fp8Tensor):
        return _fp8_tensor_attention(q, k, v, state, descales=descales, config=config, scale=scale,
                                     out_dtype=out_dtype, model_backward=model_backward, lengths=lengths)
    if q.dtype in DTYPES:
        return _fp8_inputs_attention(q, k, v, state, descales=descales, config=config, scale=scale,
                                     out_dtype=torch.bfloat16 if out_dtype is None else out_dtype, lengths=lengths)
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise invalid_argument("q.dtype", q.dtype, "torch.bfloat16 or torch.float16 (quantized inside), "
                                                   "or the state's FP8 dtype with descales")
    if descales is not None or out_dtype not in (None, q.dtype):
        field = "descales" if descales is not None else "out_dtype"
        raise invalid_argument(field, "given", f"not given for {q.dtype} inputs (O comes back in q's dtype)")
    if eager_road(q, k, v):
        return _fp8_operators.eager_attention(q, k, v, state=state, config=config, scale=scale,
                                              model_backward=model_backward, **lengths)
    return _through_operators(_fp8_operators.attention, q, k, v, state, config=config, scale=scale,
                              model_backward=model_backward, lengths=lengths)


def _require_descales(descales, q):
    if not (isinstance(descales, (tuple, list)) and len(descales) == 3):
        raise invalid_argument("descales", type(descales).__name__,
                               "(descale_q, descale_k, descale_v) for FP8 inputs: float32 one-element tensors")
    for name, t in zip(("descale_q", "descale_k", "descale_v"), descales):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1 or t.device != q.device:
            shown = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise invalid_argument(f"descales.{name}", shown, f"a float32 one-element tensor on {q.device}")


def _fp8_inputs_attention(q, k, v, state, *, descales, config, scale, out_dtype, lengths):
    """fp8_attention of inputs already in FP8: forward only, by road 2 or 3."""
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
    # Road 2 runs the body directly, road 3 its operator: both take the same arguments.
    eager = eager_road(q, k, v, *descales)
    forward = _fp8_operators.eager_fp8_inputs_forward if eager else _fp8_operators.fp8_inputs_forward
    o8, o, _, used = forward(q, k, v, *descales, state=state, config=config, scale=scale, out_dtype=out_dtype,
                             **lengths)
    return (o8, used[3:]) if out_dtype == state.dtype else o


def _fp8_tensor_attention(q, k, v, state, *, descales, config, scale, out_dtype, model_backward, lengths):
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
    if eager_road(q.data8, k.data8, v.data8):
        return _fp8_operators.eager_fp8_tensor_attention(q, k, v, state=state, config=config, scale=scale,
                                                         model_backward=model_backward, **lengths)
    return _through_operators(_fp8_operators.fp8_tensor_attention, q, k, v, state, config=config, scale=scale,
                              model_backward=model_backward, lengths=lengths)


def _through_operators(operator, q, k, v, state, *, config, scale, model_backward, lengths):
    """Road 3: `operator` (_fp8_operators.attention or .fp8_tensor_attention) with the state's
    calibration flag as this call sees it; a call whose FP8 backward will run sets it, since that
    backward measures (_fp8_operators.py's docstring)."""
    calibrated = state.calibrated
    if not model_backward and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        state.calibrated = True
    return operator(q, k, v, state=state, config=config, scale=scale, model_backward=model_backward,
                    calibrated=calibrated, **lengths)
