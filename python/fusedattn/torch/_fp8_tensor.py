"""fusedattn.torch.Fp8Tensor: a tensor already in FP8 that autograd can differentiate.

PyTorch casts a gradient to its input's dtype, so the gradient of a plain float8 tensor is float8
with no scale: a gradient's magnitudes (about descale times the value's gradient) underflow there.
An Fp8Tensor is what FP8 training libraries pass between layers instead: its payload `data8` (float8)
and `descale` (a float32 one-element tensor, value = data8 * descale) under a tensor of `dtype`
(bfloat16 or float16), which is the dtype autograd sees. fp8_attention reads the payload and the
descale directly, and the gradient it returns is the value's, in `dtype`.

    q = fusedattn.torch.Fp8Tensor(q8, descale_q, torch.bfloat16, requires_grad=True)
    o = fusedattn.torch.fp8_attention(q, k, v, state, causal=True)       # O in bfloat16
    o.backward(d_o)                                                       # q.grad: bfloat16
    q = fusedattn.torch.fp8_quantize(x)   # from x in model precision, straight-through to x's gradient

Any other operation sees the dequantized value (data8 * descale in `dtype`). fp8_quantize is for
tensors that leave the attention call too (as several consumers' FP8 input); for bf16 inputs of
fp8_attention alone, passing them as they are quantizes each in one fused pass, fewer kernels than
fp8_quantize's."""
import torch

from ..errors import invalid_argument

__all__ = ["Fp8Tensor", "fp8_quantize"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_NOMINAL = (torch.bfloat16, torch.float16)
_KEEP_FP8 = (torch.ops.aten.detach.default, torch.ops.aten.alias.default, torch.ops.aten.view.default)


class Fp8Tensor(torch.Tensor):
    """data (torch.float8_e4m3fn or torch.float8_e5m2) times descale (float32, one element, on data's
    device), seen by autograd and by every other operation as a tensor of `dtype`."""

    @staticmethod
    def __new__(cls, data, descale, dtype=torch.bfloat16, requires_grad=False):
        if not isinstance(data, torch.Tensor) or data.dtype not in _FP8:
            shown = data.dtype if isinstance(data, torch.Tensor) else type(data).__name__
            raise invalid_argument("data", shown, "a torch.float8_e4m3fn or torch.float8_e5m2 tensor")
        if (not isinstance(descale, torch.Tensor) or descale.dtype != torch.float32 or descale.numel() != 1
                or descale.device != data.device):
            shown = (f"{descale.dtype} {tuple(descale.shape)} on {descale.device}" if isinstance(descale, torch.Tensor)
                     else type(descale).__name__)
            raise invalid_argument("descale", shown, f"a float32 one-element tensor on {data.device}")
        if dtype not in _NOMINAL:
            raise invalid_argument("dtype", dtype, "torch.bfloat16 or torch.float16 (the dtype autograd sees)")
        return torch.Tensor._make_wrapper_subclass(cls, data.size(), strides=data.stride(), dtype=dtype,
                                                   device=data.device, requires_grad=requires_grad)

    def __init__(self, data, descale, dtype=torch.bfloat16, requires_grad=False):
        self.data8, self.descale = data, descale.reshape(1)

    def dequantize(self):
        """The value, data8 * descale, in this tensor's dtype."""
        return (self.data8.float() * self.descale).to(self.dtype)

    def __repr__(self, *, tensor_contents=None):
        # Not the values: printing them would dequantize, which compiled code cannot do in a repr.
        return f"Fp8Tensor({self.data8.dtype}, shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"

    # torch.compile traces through Fp8Tensors as their two inner tensors.
    def __tensor_flatten__(self):
        return ["data8", "descale"], self.dtype

    @staticmethod
    def __tensor_unflatten__(inner, dtype, outer_size, outer_stride):
        return Fp8Tensor(inner["data8"], inner["descale"], dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in _KEEP_FP8:  # detaching (autograd does) and viewing keep the payload
            return Fp8Tensor(func(args[0].data8, *args[1:], **(kwargs or {})), args[0].descale, args[0].dtype)

        def plain(x):
            return x.dequantize() if isinstance(x, Fp8Tensor) else x
        return func(*torch.utils._pytree.tree_map(plain, args), **torch.utils._pytree.tree_map(plain, kwargs or {}))

    __torch_function__ = torch._C._disabled_torch_function_impl


class _QuantizeStraightThrough(torch.autograd.Function):
    """x in FP8 with current scaling (its amax maps to the format's largest value); the gradient
    passes through unchanged, as FP8 training's quantization does."""

    @staticmethod
    def forward(ctx, x, dtype):
        largest = torch.finfo(dtype).max
        amax = x.detach().abs().amax().float().reshape(1)
        scale = torch.where(amax > 0, largest / amax, torch.ones_like(amax))
        data = (x.detach().float() * scale).clamp(-largest, largest).to(dtype)
        return Fp8Tensor(data, scale.reciprocal(), x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def fp8_quantize(x, dtype=torch.float8_e4m3fn):
    """x (bfloat16 or float16) as an Fp8Tensor of `dtype` with current scaling; differentiable, with
    the straight-through gradient (x's gradient is the Fp8Tensor's)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _NOMINAL:
        shown = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise invalid_argument("x.dtype", shown, "torch.bfloat16 or torch.float16")
    if dtype not in _FP8:
        raise invalid_argument("dtype", dtype, "torch.float8_e4m3fn or torch.float8_e5m2")
    return _QuantizeStraightThrough.apply(x, dtype)
