"""fp8_attention's two Python roads around its bodies (_fp8_bodies.py): eager calls through
autograd.Functions that run the bodies directly (road 2 of fusedattn.torch's docstring), and the
registered operators for compiled code, meta tensors, subclasses and dispatch modes (road 3):
fusedattn::fp8_forward, fusedattn::fp8_inputs_forward and fusedattn::fp8_backward run the bodies on
the state's buffer, which they mutate; their fake implementations give torch.compile every
output's shape, strides and dtype; an autograd.Function wires the backward (fusedattn::backward for
backward="model"). The operators carry the state as its buffer and its options' text
(_fp8_recipe.Options: their schemas take tensors and plain values), which the bodies join again as
one Scaling, and the config as its printed form: compiled programs may outlive this process.

Calls through the operators and the state's `calibrated` flag (whether its first backward has
measured the kernel-written amaxes): an operator cannot reach the Python state, so such a call
reads the flag at its forward and hands it to its backward as a constant (in compiled code Dynamo
guards on it), and a call that will have an FP8 backward sets it then, since that backward
measures (_fp8.py). A program compiled on a fresh state therefore compiles once more on its second
call, and from then on its backwards run once. Unlike eager calls, which read the flag at the
backward, a fresh state's second forward made before the first backward has run counts as
calibrated: its backward, if it runs first, runs once with the initial scales of dP and the
gradients. Under AOTAutograd (backends aot_eager and inductor) PyTorch 2.11 checks the version of
the state's buffer at a compiled call's backward, so another forward on the same state before that
backward raises autograd's "modified by an inplace operation"; eager calls take any order.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _config
from .. import _fp8_recipe as _recipe
from . import _fp8_bodies as bodies  # by module: the tests stand CPU bodies in for the CUDA ones
from ._fp8_state import FORMATS, Scaling, dequantized
from ._operators import plain_backward
from ._tensors import Extras, view

# --- road 2: eager calls, the bodies directly -------------------------------------------------------

def eager_attention(q, k, v, *, state, config, scale, model_backward, seq_len_q=None, seq_len_kv=None):
    """O in q's dtype of model-precision inputs, differentiable; `state`: the Fp8State; the lengths
    with a config of runtime lengths."""
    return _Fp8Attention.apply(q, k, v, state, config, scale, model_backward, seq_len_q, seq_len_kv)


def eager_fp8_tensor_attention(q, k, v, *, state, config, scale, model_backward, seq_len_q=None, seq_len_kv=None):
    """O in the Fp8Tensors' dtype, differentiable with respect to their values."""
    return _Fp8TensorAttention.apply(q, k, v, state, config, scale, model_backward, seq_len_q, seq_len_kv)


class _Fp8Attention(torch.autograd.Function):
    """Eager calls: the bodies directly, without the dispatcher. The backward reads the state's
    calibration flag when it runs, and sets it."""

    @staticmethod
    def forward(ctx, q, k, v, state, config, scale, model_backward, seq_len_q, seq_len_kv):
        ctx.lengths = dict(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)  # not differentiable: kept as they are
        o, q8, k8, v8, o8, stats, used = bodies.forward(q, k, v, scaling=_scaling(state), config=config, scale=scale,
                                                        **ctx.lengths)
        ctx.state, ctx.config, ctx.scale, ctx.model_backward = state, config, scale, model_backward
        saved = (q, k, v, o, stats) if model_backward else (q8, k8, v8, o8, stats, used, q)
        ctx.save_for_backward(*saved)
        return o

    @staticmethod
    def backward(ctx, d_o):
        state = ctx.state
        if ctx.model_backward:
            d_q, d_k, d_v = bodies.model_backward(d_o, *ctx.saved_tensors, config=ctx.config, scale=ctx.scale,
                                                  **ctx.lengths)
        else:
            d_q, d_k, d_v = bodies.backward(d_o, *ctx.saved_tensors, scaling=_scaling(state), config=ctx.config,
                                            scale=ctx.scale, calibrated=state.calibrated, **ctx.lengths)
            state.calibrated = True
        return d_q, d_k, d_v, None, None, None, None, None, None


class _Fp8TensorAttention(_Fp8Attention):
    """Eager calls of Fp8Tensors: the FP8-input body on their payloads and descales, saving what
    _Fp8Attention's backward takes (its gradients are the values', in the Fp8Tensors' dtype;
    backward="model" runs on the dequantized values)."""

    @staticmethod
    def forward(ctx, q, k, v, state, config, scale, model_backward, seq_len_q, seq_len_kv):
        ctx.lengths = dict(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
        o8, o, stats, used = bodies.fp8_inputs_forward(q.data8, k.data8, v.data8, q.descale, k.descale, v.descale,
                                                       scaling=_scaling(state), config=config, scale=scale,
                                                       out_dtype=q.dtype, **ctx.lengths)
        ctx.state, ctx.config, ctx.scale, ctx.model_backward = state, config, scale, model_backward
        if model_backward:
            values = [dequantized(t.data8, t.descale.data_ptr(), q.dtype) for t in (q, k, v)]
            ctx.save_for_backward(*values, o, stats)
        else:
            ctx.save_for_backward(q.data8, k.data8, v.data8, o8, stats, used, o)  # o: the gradients' dtype
        return o


# --- road 3: the registered operators ---------------------------------------------------------------

def _scaling(state):
    """An Fp8State as the bodies take it."""
    return Scaling(state.buffer, state.options)


def _joined(buffer, options):
    """A state as the operators carry it (its buffer and its options' text), joined again."""
    return Scaling(buffer, _recipe.Options.parse(options))


@torch.library.custom_op("fusedattn::fp8_forward", mutates_args=("state",))
def _forward_op(q: Tensor, k: Tensor, v: Tensor, state: Tensor, options: str, config: str, scale: float,
                seq_len_q: Optional[Tensor] = None,
                seq_len_kv: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(o, q8, k8, v8, o8, stats, used): O in q's dtype, what the backward takes, and the descales
    of Q, K, V and O this call used."""
    return bodies.forward(q, k, v, scaling=_joined(state, options), config=config, scale=scale, seq_len_q=seq_len_q,
                          seq_len_kv=seq_len_kv)


def _check_while_tracing(q8, k8, v8, config, seq_len_q, seq_len_kv):
    """Tracing meets bad input as eager calls do: the core builds the spec from the fake FP8
    tensors' sizes, where they are plain numbers (not symbolic), and the lengths are held to it."""
    if all(isinstance(n, int) for t in (q8, k8, v8) for n in (*t.shape, *t.stride())):
        spec = config.spec(view(q8), view(k8), view(v8), 0, 0, 0)
        Extras(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv).check_lengths_and_tables(spec)


def _like(t, dtype):
    return torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=t.device)


@_forward_op.register_fake
def _(q, k, v, state, options, config, scale, seq_len_q=None, seq_len_kv=None):
    parsed, fp8 = _config.parse(config), FORMATS[_recipe.Options.parse(options).format][0]
    q8, k8, v8 = _like(q, fp8), _like(k, fp8), _like(v, fp8)  # quantize keeps each input's strides
    _check_while_tracing(q8, k8, v8, parsed, seq_len_q, seq_len_kv)
    shapes = _config.output_shapes(parsed, _config.FORWARD, q8, k8, v8)
    o8 = q.new_empty(shapes["o"], dtype=fp8)
    stats = q.new_empty(shapes["stats"], dtype=torch.float32)
    return _like(o8, q.dtype), q8, k8, v8, o8, stats, q.new_empty((4,), dtype=torch.float32)


@torch.library.custom_op("fusedattn::fp8_inputs_forward", mutates_args=("state",))
def _inputs_forward_op(q8: Tensor, k8: Tensor, v8: Tensor, descale_q: Tensor, descale_k: Tensor, descale_v: Tensor,
                       state: Tensor, options: str, config: str, scale: float, out_dtype: torch.dtype,
                       seq_len_q: Optional[Tensor] = None,
                       seq_len_kv: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(o8, o, stats, used): the forward of inputs already in FP8 (_fp8_bodies.fp8_inputs_forward)."""
    return bodies.fp8_inputs_forward(q8, k8, v8, descale_q, descale_k, descale_v,
                                     scaling=_joined(state, options), config=config, scale=scale,
                                     out_dtype=out_dtype, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)


@_inputs_forward_op.register_fake
def _(q8, k8, v8, descale_q, descale_k, descale_v, state, options, config, scale, out_dtype, seq_len_q=None,
      seq_len_kv=None):
    parsed = _config.parse(config)
    _check_while_tracing(q8, k8, v8, parsed, seq_len_q, seq_len_kv)
    shapes = _config.output_shapes(parsed, _config.FORWARD, q8, k8, v8)
    o8 = q8.new_empty(shapes["o"])
    o = o8.new_empty(0) if out_dtype == o8.dtype else _like(o8, out_dtype)
    stats = q8.new_empty(shapes["stats"], dtype=torch.float32)
    return o8, o, stats, q8.new_empty((4,), dtype=torch.float32)


@torch.library.custom_op("fusedattn::fp8_backward", mutates_args=("state",))
def _backward_op(d_o: Tensor, q8: Tensor, k8: Tensor, v8: Tensor, o8: Tensor, stats: Tensor, used: Tensor,
                 like: Tensor, state: Tensor, options: str, config: str, scale: float,
                 seq_len_q: Optional[Tensor] = None, seq_len_kv: Optional[Tensor] = None, *,
                 calibrated: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(d_q, d_k, d_v) in like's dtype (like: the forward's q)."""
    return bodies.backward(d_o, q8, k8, v8, o8, stats, used, like, scaling=_joined(state, options),
                           config=config, scale=scale, calibrated=calibrated, seq_len_q=seq_len_q,
                           seq_len_kv=seq_len_kv)


@_backward_op.register_fake
def _(d_o, q8, k8, v8, o8, stats, used, like, state, options, config, scale, seq_len_q=None, seq_len_kv=None, *,
      calibrated):
    return tuple(_like(t, like.dtype) for t in (q8, k8, v8))  # dequantize keeps the FP8 tensors' strides


def fp8_inputs_forward(q8, k8, v8, descale_q, descale_k, descale_v, *, state, config, scale, out_dtype,
                       seq_len_q=None, seq_len_kv=None):
    """fusedattn::fp8_inputs_forward of the Fp8State `state`."""
    return _inputs_forward_op(q8, k8, v8, descale_q, descale_k, descale_v, state.buffer, state.options.text, config,
                              scale, out_dtype, seq_len_q, seq_len_kv)


def eager_fp8_inputs_forward(q8, k8, v8, descale_q, descale_k, descale_v, *, state, config, scale, out_dtype,
                             seq_len_q=None, seq_len_kv=None):
    """The body of fusedattn::fp8_inputs_forward, called directly (road 2)."""
    return bodies.fp8_inputs_forward(q8, k8, v8, descale_q, descale_k, descale_v, scaling=_scaling(state),
                                     config=config, scale=scale, out_dtype=out_dtype, seq_len_q=seq_len_q,
                                     seq_len_kv=seq_len_kv)


class _OperatorAttention(torch.autograd.Function):
    """The operators' autograd: torch.library.register_autograd takes only functional operators, and
    these mutate the state, so an autograd.Function (which Dynamo traces into the graph) wires them.
    The backward's `calibrated` is the flag as the forward was traced (the module's docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, state, options, config, scale, model_backward, calibrated, seq_len_q, seq_len_kv):
        o, q8, k8, v8, o8, stats, used = _forward_op(q, k, v, state, options, config, scale, seq_len_q, seq_len_kv)
        ctx.model_backward, ctx.call = model_backward, (options, config, scale, calibrated)
        ctx.lengths = (seq_len_q, seq_len_kv)  # not differentiable: kept as they are
        ctx.save_for_backward(*((q, k, v, o, stats) if model_backward else (q8, k8, v8, o8, stats, used, q)))
        # Stashed, not saved: the backward mutates the buffer, and another forward may before it
        # runs, which a saved tensor's version check refuses. AOTAutograd (aot_eager, inductor)
        # checks it anyway in PyTorch 2.11 (the module's docstring).
        ctx.state = state
        return o

    @staticmethod
    def backward(ctx, d_o):
        options, config, scale, calibrated = ctx.call
        seq_len_q, seq_len_kv = ctx.lengths
        if ctx.model_backward:
            d_q, d_k, d_v = plain_backward(d_o, *ctx.saved_tensors, config=config, scale=scale, seq_len_q=seq_len_q,
                                           seq_len_kv=seq_len_kv)
        else:
            d_q, d_k, d_v = _backward_op(d_o, *ctx.saved_tensors, ctx.state, options, config, scale, seq_len_q,
                                         seq_len_kv, calibrated=calibrated)
        return d_q, d_k, d_v, None, None, None, None, None, None, None, None


class _OperatorFp8TensorAttention(_OperatorAttention):
    """Fp8Tensor inputs through the operators: fusedattn::fp8_inputs_forward on their payloads and
    descales, saving what _OperatorAttention's backward takes (its gradients are the values', in the
    Fp8Tensors' dtype; backward="model" runs on the dequantized values)."""

    @staticmethod
    def forward(ctx, q, k, v, state, options, config, scale, model_backward, calibrated, seq_len_q, seq_len_kv):
        o8, o, stats, used = _inputs_forward_op(q.data8, k.data8, v.data8, q.descale, k.descale, v.descale, state,
                                                options, config, scale, q.dtype, seq_len_q, seq_len_kv)
        ctx.model_backward, ctx.call = model_backward, (options, config, scale, calibrated)
        ctx.lengths = (seq_len_q, seq_len_kv)
        if model_backward:
            ctx.save_for_backward(q.dequantize(), k.dequantize(), v.dequantize(), o, stats)
        else:
            ctx.save_for_backward(q.data8, k.data8, v.data8, o8, stats, used, o)  # o: the gradients' dtype
        ctx.state = state  # stashed, as _OperatorAttention's
        return o


def _distinct(q, k, v):
    """k and v as distinct views where they are q (or v is k). PyTorch 2.11's torch.compile keeps one
    slot's gradient and drops the others' when one tensor fills several of an autograd.Function's
    inputs (pytorch/pytorch#181146): q passed as k and v got a third of its gradient."""
    return (k.view_as(k) if k is q else k), (v.view_as(v) if v is q or v is k else v)


def attention(q, k, v, *, state, config, scale, model_backward, calibrated, seq_len_q=None, seq_len_kv=None):
    """O of fusedattn::fp8_forward with the Fp8State `state`, differentiable; `calibrated`: the
    state's flag as this call sees it; the lengths with a config of runtime lengths."""
    k_in, v_in = _distinct(q, k, v)
    return _OperatorAttention.apply(q, k_in, v_in, state.buffer, state.options.text, config, scale, model_backward,
                                    calibrated, seq_len_q, seq_len_kv)


def fp8_tensor_attention(q, k, v, *, state, config, scale, model_backward, calibrated, seq_len_q=None,
                         seq_len_kv=None):
    """O in the Fp8Tensors' dtype, differentiable with respect to their values."""
    k_in, v_in = _distinct(q, k, v)
    return _OperatorFp8TensorAttention.apply(q, k_in, v_in, state.buffer, state.options.text, config, scale,
                                             model_backward, calibrated, seq_len_q, seq_len_kv)
