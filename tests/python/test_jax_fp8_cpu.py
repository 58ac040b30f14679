"""fusedattn.jax.fp8_attention without a GPU: the scaling recipes and the functional state, with the
plain-JAX FP8 kernel of jax_fp8_reference.py standing in for cuDNN's; training steps against float32
attention, the scales each recipe sets from the amaxes, runtime lengths through both passes, and the
arguments refused, naming the field.
The program exported for CUDA: test_jax_fp8_export.py; inputs already in FP8:
test_jax_fp8_inputs.py; vmap and a mesh: test_jax_fp8_vmap_mesh.py."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402  (JAX brings it; a machine without JAX may lack it)

import fusedattn  # noqa: E402
from jax_fp8_reference import (E4M3_MAX, E5M2_MAX, SLOT, inputs, make_training_step, reference,  # noqa: E402
                               rel_l2, training_step)
from jax_fp8_reference import reference_kernels  # noqa: E402, F401  (a fixture: pytest finds it here)


# Each recipe once, each with its own causal: causal reaches only the call's config (the kernel's
# mask), the scaling never looks at it, so the other two pairings tested nothing of their own.
@pytest.mark.parametrize("causal, recipe", [(False, "current"), (True, "delayed")])
def test_a_jitted_training_step_over_three_steps_is_close_to_float32(reference_kernels, recipe, causal):
    step, state = training_step(causal), fj.fp8_state(recipe, history=4)
    for i in range(3):
        q, k, v, w = inputs(i, kv_heads=2, amax=(1.0, 2.0, 3.0 + i))
        _, o, grads, state = step(q, k, v, state, w)
        ref_o, ref_grads = reference(q, k, v, w, causal)
        assert o.dtype == jnp.bfloat16 and [g.dtype for g in grads] == [jnp.bfloat16] * 3
        assert rel_l2(o, ref_o) < 0.1, (i, rel_l2(o, ref_o))
        errors = [rel_l2(g, r) for g, r in zip(grads, ref_grads)]
        assert max(errors) < 0.15, (i, errors)
        assert isinstance(state, fj.Fp8State) and state.recipe == recipe
    # The kernel-written tensors: measured once more in the first step (its backward ran twice).
    assert int((state.history[SLOT["d_q"]] != 0).sum()) == 4
    kernel_written = [SLOT[n] for n in ("d_p", "d_q", "d_k", "d_v")]
    largest = state.history[np.array(kernel_written)].max(axis=1)
    np.testing.assert_allclose(state.scale[np.array(kernel_written)], E4M3_MAX / (largest * 4), rtol=1e-6)


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_the_model_precision_backward_takes_the_unquantized_inputs(reference_kernels, recipe):
    step, state = training_step(True, backward="model"), fj.fp8_state(recipe, history=4)
    for i in range(2):
        q, k, v, w = inputs(i, kv_heads=2)
        _, o, grads, state = step(q, k, v, state, w)
        ref_o, ref_grads = reference(q, k, v, w, True)
        assert rel_l2(o, ref_o) < 0.1 and [g.dtype for g in grads] == [jnp.bfloat16] * 3
        # The stand-in's model backward is float32 math in bfloat16: only bfloat16's rounding is left.
        assert max(rel_l2(g, r) for g, r in zip(grads, ref_grads)) < 0.01, i
    kernel_written = np.array([SLOT[n] for n in ("d_o", "d_p", "d_q", "d_k", "d_v")])
    assert not state.history[kernel_written].any() and not state.amax[kernel_written].any()  # no FP8 backward ran
    assert recipe == "current" or state.history[SLOT["q"]][1] > 0  # the forward's updates are kept


def test_a_bad_backward_names_the_field():
    q, k, v, _ = inputs(0)
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fj.fp8_attention(q, k, v, fj.fp8_state(), backward="bf16")
    assert caught.value.field == "backward"


def test_e5m2_runs_the_same_recipes(reference_kernels):
    step, state = training_step(True), fj.fp8_state("delayed", dtype=jnp.float8_e5m2)
    assert float(state.scale[SLOT["s"]]) == E5M2_MAX
    for i in range(2):
        q, k, v, w = inputs(i)
        _, o, grads, state = step(q, k, v, state, w)
    ref_o, ref_grads = reference(q, k, v, w, True)
    assert rel_l2(o, ref_o) < 0.2 and max(rel_l2(g, r) for g, r in zip(grads, ref_grads)) < 0.3


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_the_hybrid_recipe_scales_dO_and_the_gradients_for_e5m2(reference_kernels, recipe):
    step = training_step(True)
    state = fj.fp8_state(recipe, history=4, grad_dtype=jnp.float8_e5m2)
    assert state.format == "hybrid" and float(state.scale[SLOT["s"]]) == E4M3_MAX
    for i in range(2):
        q, k, v, w = inputs(i)
        _, o, grads, state = step(q, k, v, state, w)
    ref_o, ref_grads = reference(q, k, v, w, True)
    assert rel_l2(o, ref_o) < 0.1 and max(rel_l2(g, r) for g, r in zip(grads, ref_grads)) < 0.3
    largest = state.history.max(axis=1) if recipe == "delayed" else state.amax
    np.testing.assert_allclose(state.scale[SLOT["q"]], E4M3_MAX / largest[SLOT["q"]], rtol=1e-6)
    np.testing.assert_allclose(state.scale[SLOT["d_o"]], E5M2_MAX / largest[SLOT["d_o"]], rtol=1e-6)
    kernel_written = np.array([SLOT[n] for n in ("d_p", "d_q", "d_k", "d_v")])
    np.testing.assert_allclose(state.scale[kernel_written],
                               E5M2_MAX / (state.history[kernel_written].max(axis=1) * 4), rtol=1e-6)


def test_a_bad_gradient_format_names_grad_dtype():
    for dtype, grad_dtype in ((jnp.float8_e5m2, jnp.float8_e4m3fn), (jnp.float8_e4m3fn, jnp.bfloat16)):
        with pytest.raises(fusedattn.InvalidArgumentError) as caught:
            fj.fp8_state(dtype=dtype, grad_dtype=grad_dtype)
        assert caught.value.field == "grad_dtype"


def test_current_scaling_takes_this_calls_amax(reference_kernels):
    q, k, v, _ = inputs(0, amax=(1.0, 2.0, 3.0))
    state = fj.fp8_state("current")
    o, after = jax.jit(fj.fp8_attention)(q, k, v, state)
    for name, x in (("q", q), ("k", k), ("v", v)):
        amax = float(jnp.abs(x.astype(jnp.float32)).max())
        assert float(after.amax[SLOT[name]]) == amax
        np.testing.assert_allclose(after.scale[SLOT[name]], E4M3_MAX / amax, rtol=1e-6)
        np.testing.assert_allclose(after.descale[SLOT[name]], amax / E4M3_MAX, rtol=1e-6)
    np.testing.assert_allclose(after.scale[SLOT["o"]], E4M3_MAX / float(jnp.abs(v.astype(jnp.float32)).max()),
                               rtol=1e-6)  # O's from V's amax
    assert float(after.scale[SLOT["s"]]) == E4M3_MAX  # fixed
    assert not after.history.any()  # current scaling keeps no history of its own inputs


def test_delayed_scaling_records_the_newest_amax_in_slot_0(reference_kernels):
    state, seen = fj.fp8_state("delayed", history=4, margin=1), []
    forward = jax.jit(fj.fp8_attention)
    for i, amax in enumerate((1.0, 4.0, 2.0)):
        q, k, v, _ = inputs(i, amax=(amax, 1.0, 1.0))
        before = float(state.scale[SLOT["q"]])
        _, state = forward(q, k, v, state)
        seen.append(float(jnp.abs(q.astype(jnp.float32)).max()))
        np.testing.assert_array_equal(state.history[SLOT["q"]], np.array(seen[::-1] + [0.0] * (4 - len(seen)),
                                                                         np.float32))
        np.testing.assert_allclose(state.scale[SLOT["q"]], E4M3_MAX / (max(seen) * 2), rtol=1e-6)  # margin 1
        assert i > 0 or before == 1.0  # the first call quantized with scale 1
    assert not state.history[SLOT["d_o"]].any()  # no backward ran


def test_the_state_is_returned_not_changed(reference_kernels):
    state = fj.fp8_state("delayed")
    fresh = jax.tree_util.tree_map(np.array, state)
    q, k, v, w = inputs(0)
    _, _, _, after = training_step(False)(q, k, v, state, w)
    for ours, kept in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(fresh)):
        np.testing.assert_array_equal(ours, kept)
    assert after.history[SLOT["q"]][0] > 0 and after.history[SLOT["d_o"]][0] > 0
    assert jax.tree_util.tree_structure(after) == jax.tree_util.tree_structure(state)


def test_a_states_first_backward_measures_the_gradients_before_the_run_that_counts(reference_kernels, monkeypatch):
    # Gradients around 1e-4 at scale 1 round to zero in E4M3 (its smallest subnormal is 2^-9): the
    # first backward of a fresh state runs once to measure them, then with scales from that.
    q, k, v, w = inputs(0)
    w = w * 1e-4
    _, ref_grads = reference(q, k, v, w, False)
    _, _, grads, state = training_step(False)(q, k, v, fj.fp8_state("current"), w)
    assert max(rel_l2(g, r) for g, r in zip(grads, ref_grads)) < 0.15
    assert int((state.history[SLOT["d_q"]] != 0).sum()) == 2  # the measuring run and the one that counts
    monkeypatch.setattr(fj.Fp8State, "_calibrated", lambda self: jnp.bool_(True))  # as if measured before
    _, _, grads, _ = make_training_step(False)(q, k, v, fj.fp8_state("current"), w)  # traced again
    assert min(rel_l2(g, r) for g, r in zip(grads, ref_grads)) > 0.5


@pytest.mark.parametrize("kwargs, field, requirement", [
    (dict(recipe="hybrid"), "recipe", '"current" or "delayed"'),
    (dict(dtype=jnp.bfloat16), "dtype", "jnp.float8_e4m3fn or jnp.float8_e5m2"),
    (dict(dtype="fp8"), "dtype", "jnp.float8_e4m3fn or jnp.float8_e5m2"),
    (dict(history=0), "history", "at least 1"),
])
def test_a_bad_state_names_the_field(kwargs, field, requirement):
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fj.fp8_state(**kwargs)
    assert caught.value.field == field and caught.value.requirement == requirement


def test_bad_calls_name_the_field():
    q = jnp.zeros((1, 64, 2, 64), jnp.bfloat16)
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fj.fp8_attention(q, q, q, object())
    assert caught.value.field == "state"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fj.fp8_attention(q.astype(jnp.float32), q, q, fj.fp8_state())
    assert caught.value.field == "q.dtype"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fj.fp8_attention(q, q.astype(jnp.float16), q, fj.fp8_state())
    assert caught.value.field == "k.dtype"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:  # the core's own check, on the FP8 spec
        fj.fp8_attention(jnp.zeros((1, 64, 2, 60), jnp.bfloat16), q, q, fj.fp8_state())
    assert caught.value.field in ("d_qk", "k.shape", "h_q")


@pytest.mark.parametrize("backward", ["fp8", "model"])
def test_runtime_lengths_reach_both_passes_under_jit(reference_kernels, backward):
    """seq_len_q and seq_len_kv go to the forward's and the backward's calls (the stand-in kernel
    masks keys past them and zeroes rows past them, as fusedattn's padding defines them), and take
    no gradient."""
    lengths = (jnp.array([64, 23], jnp.int32), jnp.array([40, 64], jnp.int32))

    def loss_fn(q, k, v, state, w):
        o, _ = fj.fp8_attention(q, k, v, state, backward=backward, seq_len_q=lengths[0], seq_len_kv=lengths[1])
        return (o.astype(jnp.float32) * w).sum(), o

    step = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3), has_aux=True))
    q, k, v, w = inputs(0, kv_heads=2)
    (_, o), grads = step(q, k, v, fj.fp8_state("current"), w)
    ref_o, ref_grads = reference(q, k, v, w, False, lengths)
    assert rel_l2(o, ref_o) < 0.1
    assert max(rel_l2(g, r) for g, r in zip(grads[:3], ref_grads)) < 0.15
    assert not np.asarray(o[1, 23:]).any() and not np.asarray(grads[0][1, 23:]).any()  # rows past seq_len_q
    assert not np.asarray(grads[1][0, 40:]).any() and not np.asarray(grads[2][0, 40:]).any()  # keys past seq_len_kv


def test_runtime_lengths_are_checked_by_name():
    q, k, v, _ = inputs(0)
    for given, field in ((dict(seq_len_q=jnp.ones(2, jnp.int32)), "seq_len_q"),
                         (dict(seq_len_q=jnp.ones(3, jnp.int32), seq_len_kv=jnp.ones(2, jnp.int32)),
                          "seq_len_q.shape")):
        with pytest.raises(fusedattn.InvalidArgumentError) as caught:
            fj.fp8_attention(q, k, v, fj.fp8_state(), **given)
        assert caught.value.field == field
