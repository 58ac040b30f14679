"""fusedattn.jax.fp8_attention on a GPU: the CPU tests' recipes with cuDNN's FP8 kernels through the
FFI calls, against float32 attention of the unquantized inputs (the tolerances of
test_torch_fp8_gpu.py: the errors include the inputs' quantization), the recipes' scales from the
kernels' amaxes, runtime lengths, and Hopper's refusal of a d=64 FP8 backward."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
if not any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("no GPU visible to JAX", allow_module_level=True)
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402  (JAX brings it; a machine without JAX may lack it)

import fusedattn  # noqa: E402
from jax_fp8_reference import E4M3_MAX, SLOT, attend, fp8_inputs, rel_l2  # noqa: E402
# A fresh jitted step each time, not jax_fp8_reference's shared ones: those may have been traced with
# its stand-in kernels (one pytest run of both files), and a hit in their cache would skip cuDNN's.
from jax_fp8_reference import make_training_step as training_step  # noqa: E402
from jax_fp8_reference import reference as cpu_reference  # noqa: E402
from loaded_cudnn import skip_if_refused_for_the_loaded_cudnn  # noqa: E402

O_TOLERANCE, GRAD_TOLERANCE = 0.1, 0.15


def reference(q, k, v, w, causal, lengths=()):
    with jax.default_matmul_precision("highest"):  # no TF32 in the reference
        return cpu_reference(q, k, v, w, causal, lengths)


def inputs(seed, b=2, s=256, h=4, d=128, scale=1.0):
    keys = jax.random.split(jax.random.key(seed), 4)
    q, k, v, w = (jax.random.uniform(key, (b, s, h, d), minval=-1, maxval=1) for key in keys)
    return (q * scale).astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), w


@pytest.mark.parametrize("recipe", ["current", "delayed"])
@pytest.mark.parametrize("causal", [True, False])
def test_a_jitted_training_step_matches_float32_attention_over_steps(recipe, causal):
    step, state = training_step(causal), fj.fp8_state(recipe, history=4)
    for i in range(3):  # delayed scaling uses the history from the second step on
        q, k, v, w = inputs(i)
        _, o, grads, state = step(q, k, v, state, w)
        ref_o, ref_grads = reference(q, k, v, w, causal)
        errors = {"o": rel_l2(o, ref_o), **{n: rel_l2(g, r) for n, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)}}
        assert errors["o"] < O_TOLERANCE, (i, errors)
        assert max(errors[n] for n in ("dq", "dk", "dv")) < GRAD_TOLERANCE, (i, errors)
    assert int((state.history[SLOT["d_q"]] != 0).sum()) == 4  # the first backward measured once more
    for name in ("d_p", "d_q", "d_k", "d_v"):  # the kernels reported amaxes; scales keep two bits of headroom
        largest = float(state.history[SLOT[name]].max())
        assert largest > 0
        np.testing.assert_allclose(state.scale[SLOT[name]], E4M3_MAX / (largest * 4), rtol=1e-6)


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_the_model_precision_backward_matches_float32_attention(recipe):
    step, state = training_step(True, backward="model"), fj.fp8_state(recipe, history=4)
    for i in range(2):
        q, k, v, w = inputs(i)
        _, o, grads, state = step(q, k, v, state, w)
        ref_o, ref_grads = reference(q, k, v, w, True)
        assert rel_l2(o, ref_o) < O_TOLERANCE
        assert max(rel_l2(g, r) for g, r in zip(grads, ref_grads)) < GRAD_TOLERANCE, i
    assert not state.history[np.array([SLOT[n] for n in ("d_p", "d_q", "d_k", "d_v")])].any()  # no FP8 backward


def test_current_scaling_takes_this_calls_amax():
    q, k, v, _ = inputs(3, scale=3.0)
    _, state = jax.jit(lambda q, k, v, s: fj.fp8_attention(q, k, v, s, causal=True))(q, k, v, fj.fp8_state("current"))
    amax = float(jnp.abs(q.astype(jnp.float32)).max())
    assert float(state.amax[SLOT["q"]]) == amax
    np.testing.assert_allclose(state.scale[SLOT["q"]], E4M3_MAX / amax, rtol=1e-6)
    assert float(state.scale[SLOT["s"]]) == E4M3_MAX
    assert 0 < float(state.amax[SLOT["s"]]) <= 1 and float(state.amax[SLOT["o"]]) > 0  # the forward's amaxes


def test_delayed_scaling_keeps_a_history():
    state, amaxes = fj.fp8_state("delayed", history=3), []
    forward = jax.jit(lambda q, k, v, s: fj.fp8_attention(q, k, v, s, causal=True))
    for i in range(4):
        q, k, v, _ = inputs(20 + i, scale=i + 1.0)  # a growing amax
        amaxes.append(float(jnp.abs(q.astype(jnp.float32)).max()))
        _, state = forward(q, k, v, state)
    np.testing.assert_allclose(state.history[SLOT["q"]], amaxes[::-1][:3], rtol=1e-6)  # slot 0 the newest
    np.testing.assert_allclose(state.scale[SLOT["q"]], E4M3_MAX / max(amaxes[1:]), rtol=1e-6)


def test_the_state_is_returned_not_changed():
    state = fj.fp8_state("delayed")
    q, k, v, w = inputs(5)
    _, _, _, after = training_step(True)(q, k, v, state, w)
    assert not np.asarray(state.history).any() and np.asarray(after.history[SLOT["d_o"]]).any()


def test_hoppers_fp8_backward_at_d64_is_refused_naming_d_qk():
    if jax.devices()[0].compute_capability != "9.0":
        pytest.skip("the d=128 limit of the FP8 backward is Hopper's")
    q, k, v, w = inputs(0, d=64)
    o, _ = jax.jit(lambda q, k, v, s: fj.fp8_attention(q, k, v, s, causal=True))(q, k, v, fj.fp8_state())
    assert o.shape == q.shape  # the forward takes d=64
    with pytest.raises(fusedattn.NotSupportedError, match="d_qk"):
        training_step(True)(q, k, v, fj.fp8_state(), w)


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
@pytest.mark.parametrize("causal", [True, False])
def test_fp8_inputs_match_float32_attention_of_their_values(causal, dtype):
    # Against the FP8 inputs' own values the errors are the kernel's (the probabilities and O
    # rounded to FP8): the C++ check's forward tolerance, 2^-(m+1).
    tolerance = 2.0 ** -4 if dtype == jnp.float8_e4m3fn else 2.0 ** -3
    (q8, k8, v8), descales, values = fp8_inputs(1, dtype)
    with jax.default_matmul_precision("highest"):
        want = attend(*values, 1 / np.sqrt(q8.shape[-1]), causal)[0]
    state = fj.fp8_state("current", dtype=dtype)
    o, after = jax.jit(lambda *a: fj.fp8_attention(*a[:4], causal=causal, descales=a[4:]))(q8, k8, v8, state, *descales)
    assert o.dtype == jnp.bfloat16 and rel_l2(o, want) < tolerance
    (o8, descale_o), _ = jax.jit(lambda *a: fj.fp8_attention(*a[:4], causal=causal, descales=a[4:], out_dtype=dtype))(
        q8, k8, v8, state, *descales)
    assert o8.dtype == dtype and rel_l2(o8.astype(jnp.float32) * descale_o, want) < tolerance
    assert 0 < float(after.amax[SLOT["o"]]) <= float(after.amax[SLOT["v"]]) * (1 + tolerance)  # the kernel's amax of O


def test_vmap_with_cudnns_kernels_gives_each_element_its_own_call():
    # Two problems of different ranges mapped at once, each against its own call and float32.
    elements = [inputs(i, s=128, scale=1.0 + 3 * i) for i in range(2)]
    q, k, v, w = (jnp.stack(x) for x in zip(*elements))
    step, state = training_step(True), fj.fp8_state("current", history=4)
    _, o, grads, after = jax.vmap(step, in_axes=(0, 0, 0, None, 0))(q, k, v, state, w)
    for i, element in enumerate(elements):
        _, want_o, want_grads, want_state = step(*element[:3], state, element[3])
        assert rel_l2(o[i], want_o) < 1e-3 and max(rel_l2(g[i], r) for g, r in zip(grads, want_grads)) < 1e-3
        np.testing.assert_allclose(after.amax[i], want_state.amax, rtol=1e-5)
        ref_o, ref_grads = reference(*element, True)
        assert rel_l2(o[i], ref_o) < O_TOLERANCE
        assert max(rel_l2(g[i], r) for g, r in zip(grads, ref_grads)) < GRAD_TOLERANCE


@pytest.mark.parametrize("backward", ["fp8", "model"])
def test_runtime_lengths_match_float32_attention_with_the_padding_masked(backward):
    """seq_len_q and seq_len_kv through cuDNN's FP8 kernels (a padding mask, as TransformerEngine's
    FP8 attention takes it): the reference masks keys past each length and zeroes rows past them,
    as fusedattn defines padding, and fusedattn's rows and keys past them are zero."""
    skip_if_refused_for_the_loaded_cudnn("layout=bshd dtype=e4m3 b=3 s=256 h=4 d=128 padding=1")
    lengths = (jnp.array([256, 100, 37], jnp.int32), jnp.array([256, 180, 37], jnp.int32))

    def loss_fn(q, k, v, state, w):
        o, _ = fj.fp8_attention(q, k, v, state, causal=True, backward=backward, seq_len_q=lengths[0],
                                seq_len_kv=lengths[1])
        return (o.astype(jnp.float32) * w).sum(), o

    step = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3), has_aux=True))
    q, k, v, w = inputs(0, b=3)
    (_, o), grads = step(q, k, v, fj.fp8_state("current"), w)
    ref_o, ref_grads = reference(q, k, v, w, True, lengths)
    errors = {"o": rel_l2(o, ref_o), **{n: rel_l2(g, r) for n, g, r in zip(("dq", "dk", "dv"), grads[:3], ref_grads)}}
    assert errors["o"] < O_TOLERANCE, errors
    assert max(errors[n] for n in ("dq", "dk", "dv")) < GRAD_TOLERANCE, errors
    assert not np.asarray(o[1, 100:]).any() and not np.asarray(grads[0][2, 37:]).any()
    assert not np.asarray(grads[1][1, 180:]).any() and not np.asarray(grads[2][1, 180:]).any()
