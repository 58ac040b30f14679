"""fusedattn.jax.context_parallel_attention without a GPU, traced with kernels whose results are
typed as not varying over the mesh axis, as the core's FFI calls' are on the GPU: every lax.switch
over piece kinds must still compile (dense and packed, causal, windowed)."""
import pytest

pytest.importorskip("jax", reason="JAX not installed")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")

from jax_cp_check import run_program  # noqa: E402

UNVARYING_CHILD = r"""
import functools, jax, jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec as P
import fusedattn.jax as fj
from fusedattn.jax._calls import BACKWARD, FORWARD
from fusedattn.jax._kernels import KERNELS

# Stand-ins whose results are typed as not varying over the mesh axis, as the core's FFI calls'
# are on the GPU (zeros, not made from the inputs): every lax.switch over piece kinds must still
# type its branches alike.
def forward(call, q, k, v, *rest):
    stats = jnp.zeros((q.shape[0], q.shape[2], q.shape[1]) if q.ndim == 4 else q.shape[:2], jnp.float32)
    return jnp.zeros(q.shape, q.dtype), stats
def backward(call, q, k, v, o, stats, d_o, *rest):
    return jnp.zeros(q.shape, q.dtype), jnp.zeros(k.shape, k.dtype), jnp.zeros(v.shape, v.dtype)
KERNELS.update({FORWARD: forward, BACKWARD: backward})
mesh = jax.make_mesh((4,), ("cp",), axis_types=(AxisType.Auto,))
q, t, cu = jnp.ones((2, 64, 4, 32), jnp.bfloat16), jnp.ones((80, 4, 32), jnp.bfloat16), jnp.asarray([0, 24, 24, 32, 80])
for scheme, causal, balanced, window, packed in (("ring", True, True, (-1, -1), False), ("all_gather", False, False, (5, 9), False),
                                                 ("ring", True, True, (5, 0), True)):
    x = t if packed else q
    spec = P("cp") if packed else P(None, "cp")
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec,) * 3 + (P(),), out_specs=spec)
    def split(q, k, v, cu):
        return fj.context_parallel_attention(q, k, v, axis_name="cp", causal=causal, scheme=scheme, load_balanced=balanced,
                                             window=window, cu_seqlens=cu.astype(jnp.int32) if packed else None,
                                             max_seqlen=48)
    jax.jit(jax.grad(lambda x: split(x, x, x, cu).astype(jnp.float32).sum()))(x).block_until_ready()
    print("COMPILED", scheme, packed)
"""


def test_kernel_results_typed_as_not_varying_still_switch():
    # On the H200 every switch over piece kinds failed to trace ("switch branches must have equal
    # output types"): the FFI calls' results carry no varying mesh axis in their type, a neutral
    # branch's (made from q) does. The stand-ins here return such results.
    out = run_program(UNVARYING_CHILD)
    assert out.count("COMPILED") == 3, out
