"""fusedattn.jax without a GPU: shapes through jax.eval_shape (forward, grad, vmap), errors at
trace time, and the program exported for CUDA: the FFI custom calls with the spec attribute."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402

import fusedattn  # noqa: E402


def shaped(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_forward_and_gradient_shapes():
    q, k, v = shaped(2, 100, 8, 64), shaped(2, 150, 2, 64), shaped(2, 150, 2, 32)
    out = jax.eval_shape(lambda q, k, v: fj.attention(q, k, v, causal=True, align="bottom_right"), q, k, v)
    assert out.shape == (2, 100, 8, 32) and out.dtype == jnp.bfloat16
    grads = jax.eval_shape(jax.grad(lambda q, k, v: fj.attention(q, k, v).astype(jnp.float32).sum(), (0, 1, 2)),
                           q, k, v)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_vmap_adds_a_leading_axis():
    q = shaped(3, 2, 64, 4, 64)
    out = jax.eval_shape(jax.vmap(lambda q: fj.attention(q, q, q)), q)
    assert out.shape == q.shape


def test_bad_arguments_raise_fusedattn_errors_while_tracing():
    q = shaped(2, 64, 4, 60)
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        jax.eval_shape(lambda q: fj.attention(q, q, q), q)
    assert caught.value.field == "d_qk"
    with pytest.raises(fusedattn.InvalidArgumentError):
        fj.attention(jnp.zeros((2, 64, 4, 64), jnp.float32), jnp.zeros((2, 64, 4, 64), jnp.float32),
                     jnp.zeros((2, 64, 4, 64), jnp.float32))


def test_exported_for_cuda_calls_the_ffi_targets_with_the_spec():
    q = shaped(2, 128, 4, 64)
    loss = jax.jit(jax.grad(lambda q: fj.attention(q, q, q, causal=True).astype(jnp.float32).sum()))
    ours = [jax.export.DisabledSafetyCheck.custom_call(name)
            for name in ("fusedattn_forward", "fusedattn_inference", "fusedattn_backward")]
    exported = jax.export.export(loss, platforms=["cuda"], disabled_checks=ours)(q)
    text = exported.mlir_module()
    assert "fusedattn_forward" in text and "fusedattn_backward" in text
    assert "layout=bshd dtype=bf16 b=2 s_q=128 s_kv=128 h_q=4 h_kv=4 d_qk=64 d_v=64 window=-1,0" in text


def test_a_call_nobody_differentiates_uses_the_inference_target_without_statistics():
    q = shaped(1, 64, 2, 64)
    ours = [jax.export.DisabledSafetyCheck.custom_call("fusedattn_inference")]
    text = jax.export.export(jax.jit(lambda q: fj.attention(q, q, q)), platforms=["cuda"],
                             disabled_checks=ours)(q).mlir_module()
    assert "fusedattn_inference" in text and "fusedattn_forward" not in text and "stats=0" in text


def test_vmap_folds_the_mapped_axis_into_one_call_on_a_larger_batch():
    q = shaped(3, 2, 128, 4, 64)  # vmap over 3, batch 2 -> one call with b = 6
    ours = [jax.export.DisabledSafetyCheck.custom_call(name)
            for name in ("fusedattn_forward", "fusedattn_inference", "fusedattn_backward")]
    grad = jax.vmap(jax.grad(lambda q: fj.attention(q, q, q).astype(jnp.float32).sum()))
    text = jax.export.export(jax.jit(grad), platforms=["cuda"], disabled_checks=ours)(q).mlir_module()
    assert text.count("layout=bshd dtype=bf16 b=6 ") == 2 and "b=2 " not in text  # forward and backward
    nested = jax.eval_shape(jax.vmap(jax.vmap(lambda q: fj.attention(q, q, q, layout="sbhd"))), shaped(2, 3, 64, 5, 4, 64))
    assert nested.shape == (2, 3, 64, 5, 4, 64)


@pytest.mark.parametrize("layout, axis", [("bshd", 0), ("sbhd", 1), ("bhsd", 0)])
def test_folding_keeps_each_mapped_element_in_its_own_batch_entries(layout, axis):
    from fusedattn.jax import _fold, _unfold
    x = jnp.arange(3 * 4 * 5 * 2 * 6).reshape(3, *((4, 5, 2, 6) if axis == 0 else (5, 4, 2, 6)))  # n=3, b=4
    folded = _fold(x, axis)
    for i in range(3):
        for b in range(4):
            entry = folded[i * 4 + b] if axis == 0 else folded[:, i * 4 + b]
            assert jnp.array_equal(entry, x[i, b] if axis == 0 else x[i, :, b])
    assert jnp.array_equal(_unfold(folded, 3, axis), x)
