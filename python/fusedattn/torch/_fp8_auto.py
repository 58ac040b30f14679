"""fp8_attention's backward="auto" in PyTorch: the shape's FP8 tensors as views, the device the
choice is measured on, and the choice itself (_fp8_backward.py) made once per shape at the call, or
at trace time under torch.compile, where the answer enters the program as a Python constant."""
import torch

from .. import _fp8_backward
from .. import _fp8_recipe as _recipe
from ._call_config import fp8_config_text
from ._fp8_tensor import Fp8Tensor


def auto_backward(q, k, v, state, *, layout, causal, window, align):
    """"fp8" or "model" for fp8_attention of these inputs (bf16 or f16 tensors, or Fp8Tensors)."""
    config = fp8_config_text(layout=layout, causal=causal, window=window, align=align,
                             fp8_grads=_recipe.fp8_grads(state.name))
    fp8_name = str(state.dtype)[len("torch."):]
    views = tuple(_fp8_view(t.data8 if isinstance(t, Fp8Tensor) else t, fp8_name) for t in (q, k, v))
    return _chosen(config, views, str(q.dtype)[len("torch."):], _device_of(q))


def _device_of(q):
    """The GPU ordinal the choice is measured on; None on meta tensors, where the policy decides."""
    if q.device.type != "cuda":
        return None
    return q.device.index if q.device.index is not None else torch.cuda.current_device()


def _fp8_view(t, fp8_name):
    """The view of the FP8 tensor the forward makes of `t` (its sizes and strides), as plain ints: a
    shape that compiled code marks dynamic is fixed here, since the choice is per shape."""
    return fp8_name, tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride())


@torch.compiler.assume_constant_result  # compiled code gets the answer as a constant at trace time
def _chosen(config, views, model_dtype, device):
    if device is None:
        return "model" if _fp8_backward.chooses_model(config, *views, model_dtype, None) else "fp8"
    with torch.cuda.device(device):
        return "model" if _fp8_backward.chooses_model(config, *views, model_dtype, device) else "fp8"
