"""fusedattn.jax — the JAX adapter: XLA FFI custom calls into the same core.

The plan of a call is built when XLA instantiates the compiled program (the handler's
INSTANTIATE stage, from the spec string attribute), never while it executes; the execute stage
only enqueues it on XLA's stream with scratch memory from XLA, and is safe for command buffers.

    from fusedattn.jax import attention
    out = attention(q, k, v, causal=True)     # [batch, seq, heads, dim], like jax.nn.dot_product_attention

Differentiable (jax.custom_vjp over the core's backward); works under jit and grad; vmap runs the
call once per mapped element for now.
"""
import functools
import math
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _core as core
from . import _layouts
from .errors import CudaError, NotSupportedError, SetupError, invalid_argument

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


def _require_support(spec, pass_):
    """Raises NotSupportedError, with every reason, while tracing, where this process has a GPU
    (the answer also builds and caches the plan that the compiled call will then find). A
    process without one (exporting for CUDA elsewhere) leaves the check to the GPU that runs it."""
    try:
        ok, _, text = core.check_support(spec, pass_)
    except (CudaError, SetupError):
        return
    if not ok:
        raise NotSupportedError(f"{pass_} not supported: {text} [{spec}]")


def _stats_shape(spec):
    return (spec.batch, spec.heads_q, spec.seq_q)


def _forward_call(q, k, v, config, training=True):
    """O and, when training, the softmax statistics [b, h_q, s_q] the backward takes."""
    layout, options, scale = config
    text, spec = _spec_text(q, k, v, layout, options, stats=training)
    _require_support(spec, "forward")
    _register()
    o_type = jax.ShapeDtypeStruct(tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype)
    if not training:
        return jax.ffi.ffi_call(_INFERENCE, o_type, vmap_method="sequential")(q, k, v, spec=text,
                                                                             scale=np.float32(scale))
    stats_type = jax.ShapeDtypeStruct(_stats_shape(spec), jnp.float32)
    return jax.ffi.ffi_call(_FORWARD, (o_type, stats_type), vmap_method="sequential")(
        q, k, v, spec=text, scale=np.float32(scale))


def _backward_call(q, k, v, o, stats, d_o, config):
    layout, options, scale = config
    text, spec = _spec_text(q, k, v, layout, options)
    _require_support(spec, "backward")
    _register()
    types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    return jax.ffi.ffi_call(_BACKWARD, types, vmap_method="sequential")(
        q, k, v, o, d_o.astype(o.dtype), stats, spec=text, scale=np.float32(scale))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attention(q, k, v, config):
    return _forward_call(q, k, v, config, training=False)


def _attention_fwd(q, k, v, config):
    o, stats = _forward_call(q, k, v, config)
    return o, (q, k, v, o, stats)


def _attention_bwd(config, residuals, d_o):
    q, k, v, o, stats = residuals
    return tuple(_backward_call(q, k, v, o, stats, d_o, config))


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
