"""fusedattn.jax.fp8_attention on inputs already in FP8 (forward only), without a GPU: O against
float32 attention of the values they hold, with the plain-JAX FP8 kernel of jax_fp8_reference.py
standing in for cuDNN's; the arguments refused, naming the field."""
import functools

import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402  (JAX brings it; a machine without JAX may lack it)

import fusedattn  # noqa: E402
from jax_fp8_reference import SLOT, attend, fp8_inputs, inputs, rel_l2  # noqa: E402
from jax_fp8_reference import reference_kernels  # noqa: E402, F401  (a fixture: pytest finds it here)


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
