"""fusedattn.jax.fp8_attention without a GPU: the scaling recipes and the functional state, with a
plain-JAX FP8 kernel in fusedattn.jax._kernels.KERNELS (dequantize the FP8 inputs with their
descales, float32 attention, the amaxes, O and the gradients quantized with their scales, as cuDNN's
FP8 kernels take and return them); the program exported for CUDA with the real FFI calls and their
FP8 operands."""
import functools
import os
import subprocess
import sys

import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402  (JAX brings it; a machine without JAX may lack it)

import fusedattn  # noqa: E402
from fusedattn.jax._calls import BACKWARD, FORWARD  # noqa: E402
from fusedattn.jax._fp8_state import TENSORS  # noqa: E402
from fusedattn.jax._kernels import KERNELS  # noqa: E402

SLOT = {name: i for i, name in enumerate(TENSORS)}
E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def attend(q, k, v, scale, causal):
    """float32 attention of [b, s, h, d] arrays (GQA by repeating K/V heads); O and the statistics."""
    group = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, group, axis=2) for x in (k, v))
    logits = jnp.einsum("bshd,bthd->bhst", q, k) * scale
    if causal:
        logits = jnp.where(jnp.tril(jnp.ones(logits.shape[-2:], bool)), logits, -jnp.inf)
    stats = jax.nn.logsumexp(logits, axis=-1)
    p = jnp.exp(logits - stats[..., None])
    return jnp.einsum("bhst,bthd->bshd", p, v), stats, p


def quantized(x, scale, dtype):
    # The barrier keeps the FP8 values opaque, as the FFI call's are: without it XLA's GPU compiler
    # (allowing excess precision) drops the float32 -> FP8 -> float32 round trip, and the rounding
    # this module tests never happens.
    fp8_max = float(jnp.finfo(dtype).max)
    return jax.lax.optimization_barrier(jnp.clip(x * scale, -fp8_max, fp8_max).astype(dtype))


def fp8_forward(call, *arrays):
    """The FP8 forward as the FFI call takes and returns it (Call.inputs / Call.outputs)."""
    assert call.fp8 and len(arrays) == len(call.inputs(FORWARD))
    a = dict(zip(call.inputs(FORWARD), arrays))
    q, k, v = (a[n].astype(jnp.float32) * a["descale_" + n] for n in "qkv")
    o, stats, p = attend(q, k, v, call.scale, call.config.window == (-1, 0))
    return quantized(o, a["scale_o"], a["q"].dtype), stats, p.max(), jnp.abs(o).max()


def fp8_backward(call, *arrays):
    a = dict(zip(call.inputs(BACKWARD), arrays))
    assert len(arrays) == len(call.inputs(BACKWARD))
    if not call.fp8:  # backward="model": float32 math on the unquantized inputs, in their dtype
        q, k, v, d_o = (a[n].astype(jnp.float32) for n in ("q", "k", "v", "d_o"))
        _, pullback = jax.vjp(lambda q, k, v: attend(q, k, v, call.scale, call.config.window == (-1, 0))[0], q, k, v)
        return tuple(g.astype(a["q"].dtype) for g in pullback(d_o))
    q, k, v, d_o = (a[n].astype(jnp.float32) * a["descale_" + n] for n in ("q", "k", "v", "d_o"))
    causal = call.config.window == (-1, 0)
    _, pullback = jax.vjp(lambda q, k, v: attend(q, k, v, call.scale, causal)[0], q, k, v)
    grads = pullback(d_o)
    group = q.shape[2] // k.shape[2]
    d_p = jnp.einsum("bshd,bthd->bhst", d_o, jnp.repeat(v, group, axis=2))
    fp8 = a["d_o"].dtype  # the gradients' format: dO's (E5M2 beside E4M3 inputs, the hybrid recipe)
    out = [quantized(g, a["scale_" + n], fp8) for g, n in zip(grads, ("d_q", "d_k", "d_v"))]
    return (*out, *(jnp.abs(g).max() for g in grads), jnp.abs(d_p).max())


@pytest.fixture
def reference_kernels(monkeypatch):
    monkeypatch.setitem(KERNELS, FORWARD, fp8_forward)
    monkeypatch.setitem(KERNELS, BACKWARD, fp8_backward)


def inputs(seed, shape=(2, 64, 4, 64), kv_heads=4, amax=(1.0, 1.0, 1.0)):
    keys = jax.random.split(jax.random.key(seed), 4)
    kv_shape = shape[:2] + (kv_heads,) + shape[3:]
    q, k, v = (jax.random.normal(key, s) * a for key, s, a in zip(keys, (shape, kv_shape, kv_shape), amax))
    w = jax.random.normal(keys[3], shape)  # the loss's weights: dO
    return q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), w


def rel_l2(x, y):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


# Where the default device is the host: its programs run a few times on small arrays, and LLVM's
# optimization of them was most of their compile time, which was most of this file's. (Nothing on a
# GPU changes.)
HOST_FAST_COMPILE = ({"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
                     if jax.default_backend() == "cpu" else None)


def make_training_step(causal, backward="fp8"):
    """A jitted training step: (loss, O, the gradients of q, k, v, the next state)."""
    def loss_fn(q, k, v, state, w):
        o, _ = fj.fp8_attention(q, k, v, state, causal=causal, backward=backward)
        return (o.astype(jnp.float32) * w).sum(), o

    @functools.partial(jax.jit, compiler_options=HOST_FAST_COMPILE)
    def step(q, k, v, state, w):
        (loss, o), grads = jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, state, w)
        return loss, o, grads[:3], grads[3]  # the state's gradient is the next state
    return step


# One jitted step per (causal, backward), shared by the tests: those whose inputs have the same
# shapes and whose states the same structure reuse its compiled programs. (A test that changes what
# tracing does makes its own, make_training_step.)
training_step = functools.cache(make_training_step)


def reference(q, k, v, w, causal):
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1])
    o, pullback = jax.vjp(lambda q, k, v: attend(q, k, v, scale, causal)[0], q, k, v)
    return o, pullback(w)


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


def test_the_fp8_call_takes_its_scalars_last_and_returns_its_amaxes_last():
    from fusedattn import _config
    from fusedattn.jax._calls import Call
    call = Call(_config.config("bshd", causal=True), 0.125, fp8=True)
    assert call != Call(call.config, 0.125) and hash(call) == hash(Call(call.config, 0.125, fp8=True))
    assert call.inputs(FORWARD) == ("q", "k", "v", "descale_q", "descale_k", "descale_v", "descale_s", "scale_s",
                                    "scale_o")
    assert call.outputs(FORWARD) == ("o", "stats", "amax_s", "amax_o")
    assert call.inputs(BACKWARD) == ("q", "k", "v", "o", "stats", "d_o", "descale_q", "descale_k", "descale_v",
                                     "descale_o", "descale_d_o", "descale_s", "descale_d_p", "scale_s", "scale_d_p",
                                     "scale_d_q", "scale_d_k", "scale_d_v")
    assert call.outputs(BACKWARD) == ("d_q", "d_k", "d_v", "amax_d_q", "amax_d_k", "amax_d_v", "amax_d_p")


def exported_step(state, backward="fp8"):
    """A jitted training step on a (2, 128, 4, 128) bfloat16 q (as k and v too) exported for CUDA:
    its module text, and its forward and backward custom calls' lines."""
    q = jax.ShapeDtypeStruct((2, 128, 4, 128), jnp.bfloat16)
    state = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)

    def step(q, state):
        return jax.grad(lambda q, state: fj.fp8_attention(q, q, q, state, causal=True, backward=backward)[0].astype(
            jnp.float32).sum(), argnums=(0, 1))(q, state)
    ours = [jax.export.DisabledSafetyCheck.custom_call(name) for name in ("fusedattn_forward", "fusedattn_backward")]
    text = jax.export.export(jax.jit(step), platforms=["cuda"], disabled_checks=ours)(q, state).mlir_module()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call @fusedattn_" in line]
    return (text, [line for line in calls if "@fusedattn_forward" in line],
            [line for line in calls if "@fusedattn_backward" in line])


def test_exported_for_cuda_the_step_calls_the_ffi_targets_with_the_fp8_spec():
    text, forward, backward = exported_step(fj.fp8_state("delayed"))
    assert "layout=bshd dtype=e4m3 b=2 s_q=128 s_kv=128 h_q=4 h_kv=4 d_qk=128 d_v=128 window=-1,0" in text
    assert len(forward) == 1 and len(backward) == 2  # the measuring backward, in a conditional
    # 3 FP8 arrays and 6 scalars in; O, the statistics, 2 amaxes and the workspace out.
    assert forward[0].count("tensor<f32>") == 6 + 2 and "f8E4M3FN" in forward[0]
    assert backward[0].count("tensor<f32>") == 12 + 4


def test_exported_for_cuda_the_hybrid_backward_takes_e5m2_and_says_so_in_its_spec():
    _, forward, backward = exported_step(fj.fp8_state("delayed", grad_dtype=jnp.float8_e5m2))
    assert "f8E4M3FN" in forward[0] and "f8E5M2" not in forward[0]
    assert backward and all("f8E5M2" in line and "fp8_grads=e5m2" in line for line in backward), backward


def test_exported_for_cuda_the_model_backward_calls_the_bf16_backward():
    text, forward, backward = exported_step(fj.fp8_state("delayed"), backward="model")
    assert len(forward) == 1 and "f8E4M3FN" in forward[0]  # the FP8 forward
    assert len(backward) == 1 and "f8E4M3FN" not in backward[0] and "bf16" in backward[0]  # one BF16 backward
    assert "layout=bshd dtype=bf16 b=2 s_q=128 s_kv=128 h_q=4 h_kv=4 d_qk=128 d_v=128 window=-1,0" in text


# --- inputs already in FP8 (forward only) ------------------------------------------------------------

def fp8_inputs(seed, dtype=jnp.float8_e4m3fn):
    """Q, K, V in FP8 by current scaling, as an FP8 projection hands them on, their descales, and the
    values they hold."""
    q, k, v, _ = inputs(seed, kv_heads=2, amax=(1.0, 2.0, 3.0))
    fp8_max = float(jnp.finfo(dtype).max)
    out = []
    for x in (q, k, v):
        scale = fp8_max / jnp.max(jnp.abs(x.astype(jnp.float32)))
        x8 = (x.astype(jnp.float32) * scale).astype(dtype)
        out.append((x8, 1.0 / scale, x8.astype(jnp.float32) / scale))
    return [t[0] for t in out], tuple(t[1] for t in out), [t[2] for t in out]


# Each format once, each with its own causal (as the training steps above: the mask is the kernel's).
@pytest.mark.parametrize("causal, dtype", [(False, jnp.float8_e4m3fn), (True, jnp.float8_e5m2)],
                         ids=["e4m3", "causal_e5m2"])
def test_fp8_inputs_run_the_forward_on_their_values(reference_kernels, causal, dtype):
    (q8, k8, v8), descales, values = fp8_inputs(0, dtype)
    want = attend(*values, 1 / np.sqrt(q8.shape[-1]), causal)[0]
    state = fj.fp8_state("current", dtype=dtype)
    tolerance = 2.0 ** -4 if dtype == jnp.float8_e4m3fn else 2.0 ** -3  # O's rounding: the stand-in rounds nothing else
    def forward(out_dtype=None):  # a dtype is static: one jitted function per out_dtype
        return jax.jit(functools.partial(fj.fp8_attention, causal=causal, out_dtype=out_dtype))
    o, after = forward()(q8, k8, v8, state, descales=descales)
    assert o.dtype == jnp.bfloat16 and rel_l2(o, want) < tolerance
    amax_v = float(jnp.max(jnp.abs(values[2])))
    np.testing.assert_allclose(after.amax[SLOT["v"]], amax_v, rtol=1e-6)
    np.testing.assert_allclose(after.scale[SLOT["o"]], float(jnp.finfo(dtype).max) / amax_v, rtol=1e-6)
    (o8, descale_o), _ = forward(dtype)(q8, k8, v8, state, descales=descales)
    assert o8.dtype == dtype and rel_l2(o8.astype(jnp.float32) * descale_o, want) < tolerance


@pytest.mark.parametrize("change, field", [
    (dict(descales=None), "descales"),
    (dict(descales=(1.0, 1.0)), "descales"),
    (dict(descales=(jnp.ones(2), 1.0, 1.0)), "descales.descale_q"),
    (dict(descales=(jnp.float16(1), 1.0, 1.0)), "descales.descale_q"),
    (dict(out_dtype=jnp.float32), "out_dtype"),
])
def test_fp8_inputs_refuse_bad_arguments_naming_the_field(change, field):
    (q8, k8, v8), descales, _ = fp8_inputs(0)
    kwargs = {"descales": tuple(jnp.float32(d) for d in descales), **change}
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fj.fp8_attention(q8, k8, v8, fj.fp8_state("current"), **kwargs)
    assert caught.value.field == field


def test_fp8_inputs_must_be_the_states_format():
    (q8, k8, v8), descales, _ = fp8_inputs(0, jnp.float8_e5m2)
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fj.fp8_attention(q8, k8, v8, fj.fp8_state("current"), descales=descales)  # an E4M3 state
    assert caught.value.field == "q.dtype"
    q, k, v, _ = inputs(0)
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:  # descales belong to FP8 inputs
        fj.fp8_attention(q, k, v, fj.fp8_state("current"), descales=descales)
    assert caught.value.field == "descales"


def test_differentiating_fp8_inputs_is_refused_by_name(reference_kernels):
    # JAX's cotangent of a float8 array is float8: no room for the scale the values' gradient needs.
    (q8, k8, v8), descales, _ = fp8_inputs(0)
    state = fj.fp8_state("current")

    def loss(q8):
        o, _ = fj.fp8_attention(q8, k8, v8, state, descales=descales)
        return jnp.sum(o.astype(jnp.float32))

    jax.jit(loss)(q8)  # the forward alone runs
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        jax.grad(loss)(q8)
    assert caught.value.field == "q" and "bfloat16 or float16 inputs" in caught.value.requirement


# --- vmap and a mesh ---------------------------------------------------------------------------------

def test_vmap_gives_each_element_the_amaxes_and_scales_of_a_call_of_its_own(reference_kernels):
    # Three problems with different ranges at once: each element's O, gradients and state must be
    # what its own call gives (a call folded into one batch would share one amax among them). On the
    # host CPU even where a GPU is present: XLA's GPU compiler computes the stand-in kernel's float32
    # math apart in the mapped and the single program (O 0.064 apart on the H200, one E4M3 rounding
    # of most elements); test_jax_fp8_gpu.py has the same check with cuDNN's kernels.
    with jax.default_device(jax.devices("cpu")[0]):
        check_vmap_gives_each_element_its_own_call()


def check_vmap_gives_each_element_its_own_call():
    elements = [inputs(i, kv_heads=2, amax=(1.0 + i, 2.0, 3.0 * (i + 1))) for i in range(3)]
    q, k, v, w = (jnp.stack(x) for x in zip(*elements))
    step, state = training_step(True), fj.fp8_state("delayed", history=4)
    _, o, grads, after = jax.vmap(step, in_axes=(0, 0, 0, None, 0))(q, k, v, state, w)
    assert after.amax.shape == (3,) + state.amax.shape  # the state comes back mapped
    assert len({float(a) for a in after.amax[:, SLOT["v"]]}) == 3
    for i, element in enumerate(elements):
        _, want_o, want_grads, want_state = step(*element[:3], state, element[3])
        assert rel_l2(o[i], want_o) < 1e-3
        assert max(rel_l2(g[i], want) for g, want in zip(grads, want_grads)) < 1e-3
        for ours, want in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(want_state)):
            np.testing.assert_allclose(ours[i], want, rtol=1e-5)


MESH_CHILD = r"""
import sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
sys.path.insert(0, sys.argv[1])
import test_jax_fp8_cpu as t
import fusedattn.jax as fj
from fusedattn.jax._calls import BACKWARD, FORWARD
from fusedattn.jax._kernels import KERNELS

SHAPES = set()  # q's shape at each kernel call, as traced


def recorded(kernel):
    def run(call, *arrays):
        SHAPES.add(tuple(arrays[0].shape))
        return kernel(call, *arrays)
    return run


KERNELS.update({FORWARD: recorded(t.fp8_forward), BACKWARD: recorded(t.fp8_backward)})
mesh = jax.make_mesh((2, 4), ("data", "model"))
split = NamedSharding(mesh, P("data", None, "model", None))  # bshd: batch over "data", heads over "model"
step = t.training_step(True)
for recipe in sys.argv[2:]:  # each recipe's lines start with its name
    SHAPES.clear()
    whole_state = sharded_state = fj.fp8_state(recipe, history=4)
    for i in range(2):  # the second step runs on scales the first one's amaxes set
        q, k, v, w = t.inputs(i, shape=(4, 64, 8, 64), kv_heads=4, amax=(1.0, 2.0, 3.0 + i))
        _, o, grads, whole_state = step(q, k, v, whole_state, w)
        arrays = [jax.device_put(x, split) for x in (q, k, v, w)]
        _, sharded_o, sharded_grads, sharded_state = step(*arrays[:3], sharded_state, arrays[3])
        print(recipe, "OUT_ERR", t.rel_l2(sharded_o, o))
        print(recipe, "GRAD_ERR", max(t.rel_l2(g, want) for g, want in zip(sharded_grads, grads)))
        print(recipe, "STATE_ERR", max(float(jnp.max(jnp.abs(a - b) / jnp.maximum(jnp.abs(b), 1e-30)))
                                       for a, b in zip(jax.tree_util.tree_leaves(sharded_state),
                                                       jax.tree_util.tree_leaves(whole_state))))
        print(recipe, "SPECS", sharded_o.sharding.spec == split.spec,
              [g.sharding.spec == split.spec for g in sharded_grads])
    text = step.lower(*arrays[:3], sharded_state, arrays[3]).compile().as_text()
    print(recipe, "GATHERS", sum(text.count(op) for op in ("all-gather", "all-to-all", "collective-permute")))
    print(recipe, "SHAPES", sorted(SHAPES))
"""
RECIPES = ("current", "delayed")
# The child's programs run once on small arrays: LLVM's optimization of the host code would cost
# more than it saves, and changes nothing the test looks at.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


@functools.cache
def mesh_child():
    """One child process on 8 host devices checking every recipe: its (recipe, NAME, value) lines
    and its stdout, made by the first test that asks."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8 " + FAST_COMPILE,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", MESH_CHILD, os.path.dirname(__file__), *RECIPES], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return [line.split(" ", 2) for line in done.stdout.splitlines() if line.count(" ") >= 2], done.stdout


@pytest.mark.parametrize("recipe", RECIPES)
def test_under_a_mesh_each_device_runs_its_shard_and_the_state_is_the_whole_tensors(recipe):
    lines, stdout = mesh_child()
    lines = [(key, value) for name, key, value in lines if name == recipe]
    for key, value in lines:
        if key in ("OUT_ERR", "GRAD_ERR"):
            assert float(value) < 1e-3, stdout  # a few FP8 roundings may fall the other way
        if key == "STATE_ERR":  # every amax, scale and history: each shard's amaxes were maxed over all
            assert float(value) < 1e-5, stdout
        if key == "SPECS":
            assert value == "True [True, True, True]", stdout
    values = dict(lines)
    assert values["GATHERS"] == "0", stdout  # only reductions of amaxes cross the devices
    assert values["SHAPES"] == "[(2, 64, 2, 64), (4, 64, 8, 64)]", stdout  # per shard, and the whole one
