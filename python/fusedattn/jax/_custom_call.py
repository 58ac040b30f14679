"""The XLA FFI custom call of one pass into the core (python/bindings/jax_ffi.cpp handles it): the
handlers' registration, the results' types, and the workspace XLA plans for the call."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from .. import _config
from .. import _core as core
from ..errors import CudaError, SetupError, invalid_argument
from ._calls import BACKWARD, FORWARD, FP8_OUTPUTS, STATS

try:  # the compiled handlers exist only where jaxlib was there to build them
    from .. import _jax_ffi
    _FFI_MISSING = None
except ImportError as missing:  # raised when a call needs them, as importing them there would
    _jax_ffi, _FFI_MISSING = None, missing

TARGETS = {FORWARD: "fusedattn_forward", BACKWARD: "fusedattn_backward"}

_registered = False


def register():
    """Registers the handlers and their state type with XLA for CUDA, once per process."""
    global _registered
    if _registered:
        return
    if _jax_ffi is None:
        raise _FFI_MISSING.with_traceback(None)
    jax.ffi.register_ffi_type("fusedattn_plan_state", _jax_ffi.plan_state_type(), platform="CUDA")
    for name, stages in _jax_ffi.handlers().items():
        jax.ffi.register_ffi_target(name, stages, platform="CUDA")
    _registered = True


def _not_on_cuda(platform):
    return invalid_argument("q.device", platform, "a CUDA device (fusedattn.jax needs a CUDA device: its calls "
                                                  "are XLA custom calls into cuDNN, registered for CUDA only)")


def _refuse_lowering(ctx, q):
    raise _not_on_cuda(", ".join(p for p in ctx.module_context.platforms if p != "cuda"))


def _on_cuda_impl(q):
    platform = next(iter(q.devices())).platform
    if platform != "gpu":
        raise _not_on_cuda(platform)
    return q


# Each call passes q through this identity, so that a call lowered for another platform (arrays on
# the CPU, or jit where there is no GPU) raises InvalidArgumentError naming it, instead of XLA's
# compiler stopping at "No FFI handler registered for fusedattn_forward on a platform Host". Only
# lowering knows the platform: the arrays a call is traced with have no device, and jax.export
# traces for CUDA on machines without one; the CUDA lowering of the identity is q itself.
_on_cuda_p = Primitive("fusedattn_on_cuda")
_on_cuda_p.def_abstract_eval(lambda q: q)
_on_cuda_p.def_impl(_on_cuda_impl)
mlir.register_lowering(_on_cuda_p, lambda ctx, q: [q], platform="cuda")
mlir.register_lowering(_on_cuda_p, _refuse_lowering)


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


def _result_types(pass_, call, named):
    """Each result role's shape and dtype: the sizes the core gives (_config.output_shapes), in q's
    dtype for O, float32 for the statistics, the max logit and an FP8 amax (a scalar []), and each
    gradient in its input's (an FP8 backward's dQ, dK, dV in dO's format: E5M2 beside E4M3 inputs,
    hybrid); dBias is the bias's shape, which the core's answer does not carry."""
    shapes = _config.output_shapes(call.config, pass_, named["q"], named["k"], named["v"])
    sources = {"o": "q", "d_q": "q", "d_k": "k", "d_v": "v", "d_sink": "sink"}
    types = {}
    for role, shape in shapes.items():
        if role in (STATS, "max_logit"):
            dtype = jnp.float32
        elif call.fp8 and role in ("d_q", "d_k", "d_v"):
            dtype = named["d_o"].dtype
        else:
            dtype = named[sources[role]].dtype
        types[role] = jax.ShapeDtypeStruct(shape, dtype)
    if "bias" in named and pass_ == BACKWARD:
        types["d_bias"] = jax.ShapeDtypeStruct(named["bias"].shape, named["bias"].dtype)
    for role in FP8_OUTPUTS[pass_]:  # float32 scalars
        types[role] = jax.ShapeDtypeStruct((), jnp.float32)
    return types


def run(pass_, call, *arrays):
    """The custom call of `pass_` (FORWARD or BACKWARD) on `arrays` (in the roles Call.inputs
    gives); its results in the roles Call.outputs gives (one array where there is one role)."""
    named = dict(zip(call.inputs(pass_), arrays))
    sequences = named["cu_q"].shape[0] - 1 if call.ragged else 0
    spec = call.spec(named["q"], named["k"], named["v"], sequences)
    workspace = _workspace(spec, pass_)
    register()
    types = _result_types(pass_, call, named)
    outputs = call.outputs(pass_)
    results = jax.ffi.ffi_call(TARGETS[pass_], tuple(types[r] for r in outputs) + (workspace,))(
        _on_cuda_p.bind(arrays[0]), *arrays[1:], spec=str(spec), sequences=np.int64(sequences),
        scale=np.float32(call.scale), query_lengths=bool(call.query_lengths))
    results = results[:-1]
    return results[0] if len(outputs) == 1 else tuple(results)
