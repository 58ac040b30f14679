"""fusedattn.jax on a GPU, against jax.nn.dot_product_attention(implementation="xla") in float32
(upcast inputs) for outputs and gradients, under jit."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
if not any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("no GPU visible to JAX", allow_module_level=True)
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")
import jax.numpy as jnp  # noqa: E402

TOLERANCE = {jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def rel(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_xla_attention_in_float32(dtype, causal):
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.uniform(keys[0], (2, 333, 8, 128), minval=-1, maxval=1).astype(dtype)
    k = jax.random.uniform(keys[1], (2, 333, 2, 128), minval=-1, maxval=1).astype(dtype)
    v = jax.random.uniform(keys[2], (2, 333, 2, 128), minval=-1, maxval=1).astype(dtype)
    d_o = jax.random.uniform(keys[3], (2, 333, 8, 128), minval=-1, maxval=1)

    def ours(q, k, v):
        return (fj.attention(q, k, v, causal=causal).astype(jnp.float32) * d_o).sum()

    def reference(q, k, v):
        f32 = [x.astype(jnp.float32) for x in (q, k, v)]
        return (jax.nn.dot_product_attention(*f32, is_causal=causal, implementation="xla") * d_o).sum()

    out = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=causal))(q, k, v)
    ref = jax.nn.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), is_causal=causal,
                                       implementation="xla")
    assert rel(out, ref) < TOLERANCE[dtype]
    grads = jax.jit(jax.grad(ours, (0, 1, 2)))(q, k, v)
    ref_grads = jax.jit(jax.grad(reference, (0, 1, 2)))(q, k, v)
    for g, r in zip(grads, ref_grads):
        assert rel(g, r) < TOLERANCE[dtype]
