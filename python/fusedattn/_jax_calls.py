"""fusedattn.jax's calls into the core: what each call takes and returns, its spec, and the XLA
FFI custom call itself (python/bindings/jax_ffi.cpp handles them).

A call's arrays come in a fixed order with roles, decided by its Config (the handler reads the
same order from the spec):
    inference, forward: q, k, v, [bias], [sink], [rng], [seq_len_q, seq_len_kv],
                        [cu_seqlens_q, cu_seqlens_kv], [page_table_k, page_table_v]
    backward:           q, k, v, o, stats, d_o, then the same optional ones (never paged)
and it returns o (inference) or o and stats (forward), each then [max_logit], or d_q, d_k, d_v,
[d_bias], [d_sink] (backward); every call also returns its workspace, which the kernels drop.
"""
import dataclasses
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _core as core
from . import _layouts
from .errors import CudaError, SetupError, invalid_argument

FORWARD, BACKWARD = "fusedattn_forward", "fusedattn_backward"
STATS = "stats"
_BATCHED_BIAS = ("bhss", "b1ss")  # bias kinds that have a batch dim
_HEADED_BIAS = ("bhss", "1hss")   # bias kinds that have a heads dim


@dataclasses.dataclass(frozen=True)
class Config:
    """What fixes a call's spec beyond the arrays' shapes (hashable: calls are cached by it)."""
    layout: str                # bshd, sbhd, bhsd, or thd (packed sequences)
    options: str               # the spec string's options (window, align, softmax, bias, ...)
    scale: float
    bias: str = "none"         # the bias kind, or none
    bias_grad: bool = False    # the backward also returns dBias
    sink: bool = False         # softmax with a learnable sink: float32 [h_q] in, dSink out
    dropout: bool = False      # dropout: the Philox seed and offset come as rng, uint32[4]
    max_seqlen: Tuple[int, int] = (0, 0)  # thd: the longest query and key sequence
    padding: bool = False      # runtime lengths seq_len_q, seq_len_kv (int32 [b]) of a dense or paged call
    pages: int = 0             # paged K/V: pages a sequence (the page tables' width); k, v are the pools
    cache_layout: str = ""     # paged: the pools' layout (bshd or sbhd)
    max_logit: str = ""        # the forward also returns the max logit: "row" [b, h_q, s_q] or "head" [h_q]

    @property
    def ragged(self):
        return self.layout == "thd"

    def inputs(self, kind):
        fixed = ("q", "k", "v") if kind != "backward" else ("q", "k", "v", "o", STATS, "d_o")
        return (fixed + (("bias",) if self.bias != "none" else ()) + (("sink",) if self.sink else ())
                + (("rng",) if self.dropout else ()) + (("seq_len_q", "seq_len_kv") if self.padding else ())
                + (("cu_q", "cu_kv") if self.ragged else ())
                + (("page_table_k", "page_table_v") if self.pages else ()))

    def outputs(self, kind):
        max_logit = ("max_logit",) if self.max_logit else ()
        if kind == "inference":
            return ("o",) + max_logit
        if kind == "forward":
            return ("o", STATS) + max_logit
        return ("d_q", "d_k", "d_v") + (("d_bias",) if self.bias_grad else ()) + (("d_sink",) if self.sink else ())


_registered = False


def register():
    """Registers the handlers and their state type with XLA for CUDA, once per process."""
    global _registered
    if _registered:
        return
    from . import _jax_ffi
    jax.ffi.register_ffi_type("fusedattn_plan_state", _jax_ffi.plan_state_type(), platform="CUDA")
    for name, stages in _jax_ffi.handlers().items():
        jax.ffi.register_ffi_target(name, stages, platform="CUDA")
    _registered = True


def _spec(q, k, v, config, sequences, stats, bias_grad=False):
    """The spec of a call on these (row-major) arrays, validated: bad input fails at trace time."""
    dtype = _layouts.DTYPES.get(jnp.dtype(q.dtype).name)
    if dtype is None:
        raise invalid_argument("q.dtype", q.dtype, "float16 or bfloat16")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise invalid_argument(f"{name}.dtype", x.dtype, f"q's ({q.dtype})")
    o_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    max_q, max_kv = config.max_seqlen

    def described(shape, layout, max_seq):  # JAX arrays are dense and row-major
        logical = _layouts.logical(shape, _layouts.row_major_strides(shape), layout, sequences, max_seq)
        return _layouts.desc(dtype, logical)
    kv_layout = config.cache_layout if config.pages else config.layout  # paged: k and v are the pools
    descs = " ".join(f"{name}={described(shape, layout, max_seq)}" for name, shape, layout, max_seq in
                     (("q", q.shape, config.layout, max_q), ("k", k.shape, kv_layout, max_kv),
                      ("v", v.shape, kv_layout, max_kv), ("o", o_shape, config.layout, max_q)))
    text = (f"{descs} {config.options} stats={int(stats)}" + (" bias_grad=1" if bias_grad else "")
            + (f" kv_pages={config.pages}" if config.pages else ""))
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


def heads_q(q, config):
    return q.shape[1] if config.ragged else q.shape[_layouts.AXES[config.layout][1]]


def _stats_type(q, config):
    """float32 statistics: [b, h_q, s_q], or [t, h_q] (by token) for packed sequences."""
    if config.ragged:
        return jax.ShapeDtypeStruct((q.shape[0], q.shape[1]), jnp.float32)
    dims = _layouts.logical(q.shape, _layouts.row_major_strides(q.shape), config.layout)[0]
    return jax.ShapeDtypeStruct(dims[:3], jnp.float32)


def run(kind, config, *arrays):
    """The custom call of `kind` ("inference", "forward" or "backward") on `arrays` (in the roles
    Config.inputs gives); its results in the roles Config.outputs gives (one array for inference)."""
    named = dict(zip(config.inputs(kind), arrays))
    q, k, v = named["q"], named["k"], named["v"]
    sequences = (named["cu_q"].shape[0] - 1 if config.ragged
                 else named["page_table_k"].shape[0] if config.pages else 0)
    backward = kind == "backward"
    text, spec = _spec(q, k, v, config, sequences, stats=kind != "inference", bias_grad=backward and config.bias_grad)
    workspace = _workspace(spec, "backward" if backward else "forward")
    register()
    types = {"o": jax.ShapeDtypeStruct(tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype), STATS: _stats_type(q, config),
             "max_logit": (_stats_type(q, config) if config.max_logit == "row"
                           else jax.ShapeDtypeStruct((heads_q(q, config),), jnp.float32))}
    for role, source in (("d_q", "q"), ("d_k", "k"), ("d_v", "v"), ("d_bias", "bias"), ("d_sink", "sink")):
        if source in named:
            types[role] = jax.ShapeDtypeStruct(named[source].shape, named[source].dtype)
    outputs = config.outputs(kind)
    results = jax.ffi.ffi_call(BACKWARD if backward else FORWARD, tuple(types[r] for r in outputs) + (workspace,))(
        *arrays, spec=text, sequences=np.int64(sequences), scale=np.float32(config.scale))
    results = results[:-1]
    return results[0] if len(outputs) == 1 else tuple(results)
