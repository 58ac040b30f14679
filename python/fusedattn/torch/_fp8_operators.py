"""The registered operators of fusedattn.torch.fp8_attention (road 3 of torch.py's docstring:
compiled code, meta tensors, subclasses, dispatch modes): fusedattn::fp8_forward and
fusedattn::fp8_backward run _torch_fp8.py's bodies on the state's buffer, which they mutate; their
fake implementations give torch.compile every output's shape, strides and dtype; an
autograd.Function wires the backward (fusedattn::backward for backward="model")."""
from typing import Tuple

import torch
from torch import Tensor

from .. import _config
from .. import torch as _adapter
from . import _fp8

# The operators carry the state as its buffer and its options (recipe, margin, the FP8 format's
# name: "e4m3", "e5m2" or "hybrid", _fp8_recipe.FORMATS), and the config as its printed form:
# compiled programs may outlive this process.


@torch.library.custom_op("fusedattn::fp8_forward", mutates_args=("state",))
def fp8_forward(q: Tensor, k: Tensor, v: Tensor, state: Tensor, config: str, scale: float, recipe: str, margin: int,
                fp8_dtype: str) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(o, q8, k8, v8, o8, stats, used): O in q's dtype, what the backward takes, and the descales
    of Q, K, V and O this call used."""
    return _fp8._forward_body(q, k, v, state, config, scale, recipe, margin, fp8_dtype)


def _check_while_tracing(q8, k8, v8, config):
    """Tracing meets bad input as eager calls do: the core builds the spec from the fake FP8
    tensors' sizes, where they are plain numbers (not symbolic)."""
    if all(isinstance(n, int) for t in (q8, k8, v8) for n in (*t.shape, *t.stride())):
        config.spec(_adapter._view(q8), _adapter._view(k8), _adapter._view(v8), 0, 0, 0)


def _like(t, dtype):
    return torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=t.device)


@fp8_forward.register_fake
def _(q, k, v, state, config, scale, recipe, margin, fp8_dtype):
    parsed, fp8 = _config.parse(config), _fp8._FORMATS[fp8_dtype][0]
    q8, k8, v8 = _like(q, fp8), _like(k, fp8), _like(v, fp8)  # quantize keeps each input's strides
    _check_while_tracing(q8, k8, v8, parsed)
    o8 = q.new_empty(_adapter._out_shape(q8, v8), dtype=fp8)
    stats = q.new_empty(_adapter._stats_shape(q, parsed.layout), dtype=torch.float32)
    return _like(o8, q.dtype), q8, k8, v8, o8, stats, q.new_empty((4,), dtype=torch.float32)


@torch.library.custom_op("fusedattn::fp8_inputs_forward", mutates_args=("state",))
def fp8_inputs_forward(q8: Tensor, k8: Tensor, v8: Tensor, descale_q: Tensor, descale_k: Tensor, descale_v: Tensor,
                       state: Tensor, config: str, scale: float, recipe: str, margin: int, fp8_dtype: str,
                       out_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(o8, o, stats, used): the forward of inputs already in FP8 (_fp8_inputs_forward_body)."""
    return _fp8._fp8_inputs_forward_body(q8, k8, v8, descale_q, descale_k, descale_v, state, config, scale, recipe,
                                         margin, fp8_dtype, out_dtype)


@fp8_inputs_forward.register_fake
def _(q8, k8, v8, descale_q, descale_k, descale_v, state, config, scale, recipe, margin, fp8_dtype, out_dtype):
    parsed = _config.parse(config)
    _check_while_tracing(q8, k8, v8, parsed)
    o8 = q8.new_empty(_adapter._out_shape(q8, v8))
    o = o8.new_empty(0) if out_dtype == o8.dtype else _like(o8, out_dtype)
    stats = q8.new_empty(_adapter._stats_shape(q8, parsed.layout), dtype=torch.float32)
    return o8, o, stats, q8.new_empty((4,), dtype=torch.float32)


@torch.library.custom_op("fusedattn::fp8_backward", mutates_args=("state",))
def fp8_backward(d_o: Tensor, q8: Tensor, k8: Tensor, v8: Tensor, o8: Tensor, stats: Tensor, used: Tensor,
                 like: Tensor, state: Tensor, config: str, scale: float, recipe: str, margin: int, fp8_dtype: str, *,
                 calibrated: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(d_q, d_k, d_v) in like's dtype (like: the forward's q)."""
    return _fp8._backward_body(d_o, q8, k8, v8, o8, stats, used, like, state, config, scale, recipe, margin,
                               fp8_dtype, calibrated)


@fp8_backward.register_fake
def _(d_o, q8, k8, v8, o8, stats, used, like, state, config, scale, recipe, margin, fp8_dtype, *, calibrated):
    return tuple(_like(t, like.dtype) for t in (q8, k8, v8))  # dequantize keeps the FP8 tensors' strides


class _OperatorAttention(torch.autograd.Function):
    """The operators' autograd: torch.library.register_autograd takes only functional operators, and
    these mutate the state, so an autograd.Function (which Dynamo traces into the graph) wires them.
    The backward's `calibrated` is the flag as the forward was traced (_torch_fp8.py's docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, state, config, scale, recipe, margin, fp8_dtype, model_backward, calibrated):
        o, q8, k8, v8, o8, stats, used = fp8_forward(q, k, v, state, config, scale, recipe, margin, fp8_dtype)
        ctx.model_backward, ctx.call = model_backward, (config, scale, recipe, margin, fp8_dtype, calibrated)
        ctx.save_for_backward(*((q, k, v, o, stats) if model_backward else (q8, k8, v8, o8, stats, used, q)))
        # Stashed, not saved: the backward mutates the buffer, and another forward may before it
        # runs, which a saved tensor's version check refuses. AOTAutograd (aot_eager, inductor)
        # checks it anyway in PyTorch 2.11 (_torch_fp8.py's docstring).
        ctx.state = state
        return o

    @staticmethod
    def backward(ctx, d_o):
        config, scale, recipe, margin, fp8_dtype, calibrated = ctx.call
        if ctx.model_backward:
            q, k, v, o, stats = ctx.saved_tensors
            extras = [None] * len(_adapter._Extras.NAMES)
            d_q, d_k, d_v, _, _ = _adapter._backward_op(d_o, q, k, v, o, stats, None, None, extras, config, scale, 0, 0)
        else:
            d_q, d_k, d_v = fp8_backward(d_o, *ctx.saved_tensors, ctx.state, config, scale, recipe, margin, fp8_dtype,
                                         calibrated=calibrated)
        return d_q, d_k, d_v, None, None, None, None, None, None, None, None


def _distinct(q, k, v):
    """k and v as distinct views where they are q (or v is k). PyTorch 2.11's torch.compile keeps one
    slot's gradient and drops the others' when one tensor fills several of an autograd.Function's
    inputs (pytorch/pytorch#181146): q passed as k and v got a third of its gradient."""
    return (k.view_as(k) if k is q else k), (v.view_as(v) if v is q or v is k else v)


def attention(q, k, v, state, config, scale, recipe, margin, fp8_dtype, model_backward, calibrated):
    """O of fusedattn::fp8_forward, differentiable."""
    k_in, v_in = _distinct(q, k, v)
    return _OperatorAttention.apply(q, k_in, v_in, state, config, scale, recipe, margin, fp8_dtype, model_backward,
                                    calibrated)


class _OperatorFp8TensorAttention(_OperatorAttention):
    """Fp8Tensor inputs through the operators: fusedattn::fp8_inputs_forward on their payloads and
    descales, saving what _OperatorAttention's backward takes (its gradients are the values', in the
    Fp8Tensors' dtype; backward="model" runs on the dequantized values)."""

    @staticmethod
    def forward(ctx, q, k, v, state, config, scale, recipe, margin, fp8_dtype, model_backward, calibrated):
        o8, o, stats, used = fp8_inputs_forward(q.data8, k.data8, v.data8, q.descale, k.descale, v.descale, state,
                                                config, scale, recipe, margin, fp8_dtype, q.dtype)
        ctx.model_backward, ctx.call = model_backward, (config, scale, recipe, margin, fp8_dtype, calibrated)
        if model_backward:
            ctx.save_for_backward(q.dequantize(), k.dequantize(), v.dequantize(), o, stats)
        else:
            ctx.save_for_backward(q.data8, k.data8, v.data8, o8, stats, used, o)  # o: the gradients' dtype
        ctx.state = state  # stashed, as _OperatorAttention's
        return o


def fp8_tensor_attention(q, k, v, state, config, scale, recipe, margin, fp8_dtype, model_backward, calibrated):
    """O in the Fp8Tensors' dtype, differentiable with respect to their values."""
    k_in, v_in = _distinct(q, k, v)
    return _OperatorFp8TensorAttention.apply(q, k_in, v_in, state, config, scale, recipe, margin, fp8_dtype,
                                             model_backward, calibrated)
