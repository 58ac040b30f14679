"""fusedattn.jax — the JAX adapter: XLA FFI custom calls into the same core.

The spec of a call is fixed while tracing (from the arrays' shapes) and travels as the custom
call's attribute; XLA's INSTANTIATE stage parses it, the INITIALIZE stage before each execution
makes sure the plan for that device exists (built once), and the execute stage only enqueues it
on XLA's stream with scratch memory from XLA, so it is safe for command buffers.

    from fusedattn.jax import attention
    out = attention(q, k, v, causal=True)     # [batch, seq, heads, dim], like jax.nn.dot_product_attention

Differentiable (jax.custom_vjp over the core's backward); works under jit, grad, jax.checkpoint
and vmap, whose rule folds the mapped axis into the batch: one call, not one per element. Under
a mesh with q, k, v sharded over batch and heads, each device calls on its own shard: nothing
is gathered.
"""
import functools
import math
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _core as core
from . import _jax_partition, _layouts
from .errors import CudaError, SetupError, invalid_argument

__all__ = ["attention"]

# Targets: the training forward (O and softmax statistics), the inference forward (O alone, for a
# call nobody differentiates) and the backward.
_FORWARD, _INFERENCE, _BACKWARD = "fusedattn_forward", "fusedattn_inference", "fusedattn_backward"
_registered = False


def _register():
    """Registers the handlers and their state type with XLA for CUDA, once per process."""
    global _registered
    if _registered:
        return
    from . import _jax_ffi
    jax.ffi.register_ffi_type("fusedattn_plan_state", _jax_ffi.plan_state_type(), platform="CUDA")
    for name, stages in _jax_ffi.handlers().items():
        jax.ffi.register_ffi_target(name, stages, platform="CUDA")
    _registered = True


def _spec_text(q, k, v, layout, options, stats=True):
    """The spec of a call on these (row-major) arrays, validated: bad input fails at trace time."""
    dtype = _layouts.DTYPES.get(jnp.dtype(q.dtype).name)
    if dtype is None:
        raise invalid_argument("q.dtype", q.dtype, "float16 or bfloat16")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise invalid_argument(f"{name}.dtype", x.dtype, f"q's ({q.dtype})")
    o_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    def described(shape):  # JAX arrays are dense and row-major
        return _layouts.desc(dtype, _layouts.logical(shape, _layouts.row_major_strides(shape), layout))
    descs = " ".join(f"{name}={described(shape)}"
                     for name, shape in (("q", q.shape), ("k", k.shape), ("v", v.shape), ("o", o_shape)))
    text = f"{descs} {options} stats={int(stats)}"
    spec = core.Spec.parse(text)
    spec.validate()
    return str(spec), spec


def _workspace(spec, pass_):
    """The workspace result of a call: uint8 [bytes the plan needs], so XLA plans the memory.
    Where this process has a GPU the plan is built here, while tracing (raising NotSupportedError
    with every reason), and the compiled call finds it in the cache; a process without one
    (exporting for CUDA elsewhere) gives 0 bytes and the handler asks XLA's scratch allocator."""
    try:
        size = core.get_plan(spec, pass_).workspace_bytes
    except (CudaError, SetupError):
        size = 0
    return jax.ShapeDtypeStruct((size,), jnp.uint8)


def _stats_shape(spec):
    return (spec.batch, spec.heads_q, spec.seq_q)


def _inference_call(q, k, v, config):
    """O alone, for a call nobody differentiates."""
    layout, options, scale = config
    text, spec = _spec_text(q, k, v, layout, options, stats=False)
    workspace = _workspace(spec, "forward")
    _register()
    o_type = jax.ShapeDtypeStruct(tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype)
    o, _ = jax.ffi.ffi_call(_INFERENCE, (o_type, workspace))(q, k, v, spec=text, scale=np.float32(scale))
    return o


def _forward_call(q, k, v, config):
    """O and the softmax statistics [b, h_q, s_q] the backward takes."""
    layout, options, scale = config
    text, spec = _spec_text(q, k, v, layout, options)
    workspace = _workspace(spec, "forward")
    _register()
    o_type = jax.ShapeDtypeStruct(tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype)
    stats_type = jax.ShapeDtypeStruct(_stats_shape(spec), jnp.float32)
    o, stats, _ = jax.ffi.ffi_call(_FORWARD, (o_type, stats_type, workspace))(q, k, v, spec=text,
                                                                              scale=np.float32(scale))
    return o, stats


def _backward_call(q, k, v, o, stats, d_o, config):
    """dQ, dK, dV."""
    layout, options, scale = config
    text, spec = _spec_text(q, k, v, layout, options)
    workspace = _workspace(spec, "backward")
    _register()
    types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)) + (workspace,)
    *grads, _ = jax.ffi.ffi_call(_BACKWARD, types)(q, k, v, o, d_o, stats, spec=text, scale=np.float32(scale))
    return tuple(grads)


# --- the calls as JAX sees them ------------------------------------------------------------------
# Each kind of call takes and returns arrays in the call's layout and statistics [b, h, s].
# Under vmap the mapped axis is folded into the batch axis (one call on n·b entries rather than n
# calls), then split off again; nested vmaps fold in turn. Under a mesh each device calls on its
# shard of the batch and heads (_jax_partition).

_KERNELS = {"inference": _inference_call, "forward": _forward_call, "backward": _backward_call}
_STATS = _jax_partition.STATS
_ROLES = {"inference": (("q", "k", "v"), ("o",)),
          "forward": (("q", "k", "v"), ("o", _STATS)),
          "backward": (("q", "k", "v", "o", _STATS, "d_o"), ("d_q", "d_k", "d_v"))}


def _batch_axis(role, layout):
    return 0 if role == _STATS else _layouts.AXES[layout][0]


def _fold(x, axis):
    """[n, ...] with the batch at `axis` of the unmapped array -> that array with n·b entries."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2:])


def _unfold(x, n, axis):
    x = x.reshape(x.shape[:axis] + (n, x.shape[axis] // n) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


@functools.lru_cache(maxsize=None)
def _call(kind, config):
    """The call of `kind` ("inference", "forward", "backward") for `config`, as a function of
    arrays alone, with its batching rule and its partitioning."""
    inputs, outputs = _ROLES[kind]
    layout = config[0]
    single = len(outputs) == 1
    head_axis = _layouts.AXES[layout][1]

    @jax.custom_batching.custom_vmap
    def call(*args):
        heads = (args[0].shape[head_axis], args[1].shape[head_axis])  # q's and k's
        return _jax_partition.partitioned(_KERNELS.get, kind, config, inputs, outputs, *heads)(*args)

    @call.def_vmap
    def rule(axis_size, in_batched, *args):
        args = [x if mapped else jnp.broadcast_to(x, (axis_size,) + x.shape) for x, mapped in zip(args, in_batched)]
        out = call(*(_fold(x, _batch_axis(role, layout)) for x, role in zip(args, inputs)))
        out = (out,) if single else out
        out = tuple(_unfold(y, axis_size, _batch_axis(role, layout)) for y, role in zip(out, outputs))
        return (out[0], True) if single else (out, (True,) * len(out))

    return call


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attention(q, k, v, config):
    return _call("inference", config)(q, k, v)


def _attention_fwd(q, k, v, config):
    o, stats = _call("forward", config)(q, k, v)
    return o, (q, k, v, o, stats)


def _attention_bwd(config, residuals, d_o):
    q, k, v, o, stats = residuals
    return tuple(_call("backward", config)(q, k, v, o, stats, d_o.astype(o.dtype)))


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, *, layout: str = "bshd", causal: bool = False, align: str = "top_left",
              window: Tuple[int, int] = (-1, -1), scale: Optional[float] = None):
    """Fused attention of q, k, v in `layout` ("bshd", JAX's usual [batch, seq, heads, dim];
    "sbhd"; "bhsd"). causal / window (left, right; -1 open) and align ("top_left" or
    "bottom_right") place the mask. GQA/MQA: fewer K/V heads dividing the query heads. Returns O in
    q's layout. Errors in the arguments raise fusedattn.errors classes while tracing."""
    if layout not in _layouts.AXES:
        raise invalid_argument("layout", layout, "one of bshd, sbhd, bhsd")
    if causal:
        window = (window[0], 0)
    options = f"window={window[0]},{window[1]} align={align}"
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _attention(q, k, v, (layout, options, scale))
