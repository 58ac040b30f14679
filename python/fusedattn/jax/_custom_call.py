"""fusedattn.jax's calls into the core: what fixes a call (Call: the core Config and the little it
cannot hold), what each pass takes and returns, and the XLA FFI custom call itself
(python/bindings/jax_ffi.cpp handles them).

A pass's arrays come in a fixed order with roles, decided by the Config (the handler reads the same
order from the spec the Config makes):
    forward:  q, k, v, [bias], [sink], [rng], [seq_len_q, seq_len_kv],
              [cu_seqlens_q, cu_seqlens_kv], [page_table_k, page_table_v], [mod_scalars], [mod_t0 ..]
    backward: q, k, v, o, stats, d_o, then the same optional ones (never paged)
(mod_*: a score modifier's float32 scalars [n] and its tensors, fusedattn/score_mod.h)
and it returns o, [stats], [max_logit] (forward) or d_q, d_k, d_v, [d_bias], [d_sink] (backward);
every call also returns its workspace, which the kernels drop. An FP8 call (Call.fp8: q, k, v in
E4M3 or E5M2, fusedattn/fp8_scales.h) takes float32 scalars after all of those and returns the
amaxes its kernels write after its other results:
    forward:  ... descale_q, descale_k, descale_v, descale_s, scale_s, scale_o -> ... amax_s, amax_o
    backward: ... descale_q, descale_k, descale_v, descale_o, descale_d_o, descale_s, descale_d_p,
              scale_s, scale_d_p, scale_d_q, scale_d_k, scale_d_v -> ... amax_d_q, amax_d_k, amax_d_v, amax_d_p
"""
import dataclasses
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _config
from .. import _core as core
from ..errors import CudaError, SetupError

FORWARD, BACKWARD = _config.FORWARD, _config.BACKWARD
TARGETS = {FORWARD: "fusedattn_forward", BACKWARD: "fusedattn_backward"}
STATS = "stats"

# Per dense layout, the array axis that holds each logical axis (batch, heads, sequence, head dim):
# for the axes vmap folds and a mesh splits. The core describes the arrays themselves.
AXES = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}

# An FP8 call's scalar operands and the amaxes it returns, in the order jax_ffi.cpp reads them.
FP8_INPUTS = {FORWARD: ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"),
              BACKWARD: ("descale_q", "descale_k", "descale_v", "descale_o", "descale_d_o", "descale_s",
                         "descale_d_p", "scale_s", "scale_d_p", "scale_d_q", "scale_d_k", "scale_d_v")}
FP8_OUTPUTS = {FORWARD: ("amax_s", "amax_o"), BACKWARD: ("amax_d_q", "amax_d_k", "amax_d_v", "amax_d_p")}


def view(x):
    """An array as the core takes it: (dtype name, shape, element strides); JAX arrays are dense
    and row-major."""
    strides, step = [], 1
    for size in reversed(x.shape):
        strides.append(step)
        step *= size
    return jnp.dtype(x.dtype).name, tuple(x.shape), tuple(reversed(strides))


@dataclasses.dataclass(frozen=True)
class Call:
    """What fixes a call beyond its arrays' shapes: the core Config (every option, shared with
    fusedattn.torch), the scale, and for thd the longest sequences (the plan's bucket: host values
    the arrays do not carry), and whether q, k, v are FP8 (then the call takes and returns its
    scaling scalars). Hashable: calls are cached and traced by it."""
    config: core.Config
    scale: float
    max_seqlen: Tuple[int, int] = (0, 0)
    fp8: bool = False

    @property
    def ragged(self):
        """Sequences placed by cumulative offsets (cu_seqlens_q, cu_seqlens_kv)."""
        return "thd" in (self.config.layout, self.config.kv_layout)

    def spec(self, q, k, v, sequences=0):
        """The validated spec of this call on q, k, v (for paged calls k, v are the pools): the core
        checks everything here, while tracing, with the words it uses for every adapter."""
        return self.config.spec(view(q), view(k), view(v), sequences, *self.max_seqlen)

    def inputs(self, pass_):
        c = self.config
        fixed = ("q", "k", "v") if pass_ == FORWARD else ("q", "k", "v", "o", STATS, "d_o")
        return (fixed + (("bias",) if c.bias != "none" else ()) + (("sink",) if c.softmax == "sink" else ())
                + (("rng",) if c.dropout > 0.0 else ())
                + (("seq_len_q", "seq_len_kv") if c.padding and not self.ragged else ())
                + (("cu_q", "cu_kv") if self.ragged else ())
                + (("page_table_k", "page_table_v") if c.kv_pages else ())
                + (("mod_scalars",) if c.score_mod_scalars else ())
                + tuple(f"mod_t{i}" for i in range(len(c.score_mod_tensor_axes)))
                + (FP8_INPUTS[pass_] if self.fp8 else ()))

    def outputs(self, pass_):
        c = self.config
        fp8 = FP8_OUTPUTS[pass_] if self.fp8 else ()
        if pass_ == FORWARD:
            return ("o",) + ((STATS,) if c.stats else ()) + (("max_logit",) if c.max_logit != "none" else ()) + fp8
        return (("d_q", "d_k", "d_v") + (("d_bias",) if c.bias_grad else ())
                + (("d_sink",) if c.softmax == "sink" else ()) + fp8)


_registered = False


def register():
    """Registers the handlers and their state type with XLA for CUDA, once per process."""
    global _registered
    if _registered:
        return
    from .. import _jax_ffi
    jax.ffi.register_ffi_type("fusedattn_plan_state", _jax_ffi.plan_state_type(), platform="CUDA")
    for name, stages in _jax_ffi.handlers().items():
        jax.ffi.register_ffi_target(name, stages, platform="CUDA")
    _registered = True


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


def _result_types(call, spec, named):
    """Each result role's shape and dtype. Per query row (stats, a row max logit): float32
    [b, h_q, s_q], or [t, h_q] by token for thd; a head's max logit: [h_q]; an FP8 amax: float32 []."""
    q, v = named["q"], named["v"]
    rows = (q.shape[0], spec.heads_q) if call.config.layout == "thd" else (spec.batch, spec.heads_q, spec.seq_q)
    types = {"o": jax.ShapeDtypeStruct(tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype),
             STATS: jax.ShapeDtypeStruct(rows, jnp.float32),
             "max_logit": jax.ShapeDtypeStruct(rows if call.config.max_logit == "row" else (spec.heads_q,),
                                               jnp.float32)}
    for role, source in (("d_q", "q"), ("d_k", "k"), ("d_v", "v"), ("d_bias", "bias"), ("d_sink", "sink")):
        if source in named:
            # An FP8 backward writes its gradients in dO's format (E5M2 beside E4M3 inputs: hybrid).
            fp8_gradient = call.fp8 and "d_o" in named and role in ("d_q", "d_k", "d_v")
            dtype = named["d_o"].dtype if fp8_gradient else named[source].dtype
            types[role] = jax.ShapeDtypeStruct(named[source].shape, dtype)
    for role in FP8_OUTPUTS[FORWARD] + FP8_OUTPUTS[BACKWARD]:  # float32 scalars
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
    types = _result_types(call, spec, named)
    outputs = call.outputs(pass_)
    results = jax.ffi.ffi_call(TARGETS[pass_], tuple(types[r] for r in outputs) + (workspace,))(
        *arrays, spec=str(spec), sequences=np.int64(sequences), scale=np.float32(call.scale))
    results = results[:-1]
    return results[0] if len(outputs) == 1 else tuple(results)
