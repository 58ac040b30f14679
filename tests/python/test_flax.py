"""fusedattn.flax: the nnx layer's shapes and parameters without a GPU, and its program exported
for CUDA; on a GPU, its output against the same projections around XLA's attention in float32."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
nnx = pytest.importorskip("flax.nnx", reason="Flax not installed")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")
import jax.numpy as jnp  # noqa: E402

import fusedattn  # noqa: E402
from fusedattn.flax import MultiHeadAttention  # noqa: E402

HAS_GPU = any(d.platform == "gpu" for d in jax.devices())


def layer(**options):
    return MultiHeadAttention(num_heads=8, num_kv_heads=2, in_features=256, causal=True, rngs=nnx.Rngs(0), **options)


def test_shapes_and_parameters():
    model = layer()
    assert model.key.kernel[...].shape == (256, 2 * 32) and model.query.kernel[...].shape == (256, 8 * 32)
    out = jax.eval_shape(lambda x: model(x), jax.ShapeDtypeStruct((2, 100, 256), jnp.bfloat16))
    assert out.shape == (2, 100, 256) and out.dtype == jnp.bfloat16
    cross = jax.eval_shape(lambda x, c: model(x, c), jax.ShapeDtypeStruct((2, 100, 256), jnp.bfloat16),
                           jax.ShapeDtypeStruct((2, 70, 256), jnp.bfloat16))
    assert cross.shape == (2, 100, 256)


def test_the_core_checks_the_layer_before_its_parameters_exist():
    with pytest.raises(fusedattn.InvalidArgumentError) as ours:
        MultiHeadAttention(num_heads=8, num_kv_heads=3, in_features=256, rngs=nnx.Rngs(0))
    with pytest.raises(fusedattn.InvalidArgumentError) as theirs:  # the same words as for any call
        fusedattn._core.Spec.parse("layout=bshd dtype=bf16 b=1 s_q=1 s_kv=1 h_q=8 h_kv=3 d_qk=32 d_v=32").validate()
    assert str(ours.value) == str(theirs.value) == "h_q = 8: a multiple of h_kv = 3 (GQA/MQA)"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        MultiHeadAttention(num_heads=8, in_features=256, head_dim=12, rngs=nnx.Rngs(0))
    assert caught.value.field == "d_qk"


def test_exported_for_cuda_trains_through_fusedattn():
    model = layer()
    graphdef, params = nnx.split(model)

    def loss(params, x):
        return nnx.merge(graphdef, params)(x).astype(jnp.float32).sum()

    x = jax.ShapeDtypeStruct((2, 128, 256), jnp.bfloat16)
    ours = [jax.export.DisabledSafetyCheck.custom_call(n) for n in ("fusedattn_forward", "fusedattn_backward")]
    text = jax.export.export(jax.jit(jax.grad(loss)), platforms=["cuda"], disabled_checks=ours)(params, x).mlir_module()
    assert "fusedattn_forward" in text and "fusedattn_backward" in text and "h_q=8 h_kv=2 d_qk=32" in text


@pytest.mark.skipif(not HAS_GPU, reason="no GPU visible to JAX")
def test_matches_the_same_projections_around_xla_attention():
    model = layer(head_dim=64)
    x = jax.random.uniform(jax.random.key(1), (2, 200, 256), minval=-1, maxval=1).astype(jnp.bfloat16)
    out = jax.jit(lambda x: model(x))(x)

    def projected(linear, heads):
        y = x.astype(jnp.float32) @ linear.kernel[...].astype(jnp.bfloat16).astype(jnp.float32)
        return y.reshape(2, 200, heads, 64)
    o = jax.nn.dot_product_attention(projected(model.query, 8), projected(model.key, 2), projected(model.value, 2),
                                     is_causal=True, implementation="xla")
    ref = o.reshape(2, 200, 8 * 64) @ model.out.kernel[...].astype(jnp.bfloat16).astype(jnp.float32)
    err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
    assert err < 2e-2  # bf16 projections and attention, against float32 on the same bf16 weights
