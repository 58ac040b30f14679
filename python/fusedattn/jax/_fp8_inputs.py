"""fp8_attention on inputs already in FP8 (the state's dtype, with their descales): the forward only,
O dequantized or as (o8, descale_o), and differentiation refused by name."""
import functools

import jax
import jax.numpy as jnp

from .._fp8_recipe import Update
from ..errors import invalid_argument
from ._fp8_kernels import fp8_forward
from ._fp8_state import SLOT, as_dtype, dequantize, updated


def require_fp8_inputs(q, k, v, state, *, descales, out_dtype):
    """Inputs in the state's FP8 dtype, their three float32 descales, and an output dtype O can take."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.dtype(x.dtype) != state.dtype:
            raise invalid_argument(f"{name}.dtype", x.dtype, f"{state.dtype}, the state's format, for every input")
    if not (isinstance(descales, (tuple, list)) and len(descales) == 3):
        raise invalid_argument("descales", type(descales).__name__,
                               "(descale_q, descale_k, descale_v) for FP8 inputs: float32 scalars")
    for name, d in zip(("descale_q", "descale_k", "descale_v"), descales):
        if jnp.size(d) != 1 or jnp.dtype(jnp.result_type(d)) != jnp.dtype(jnp.float32):
            raise invalid_argument(f"descales.{name}", f"{jnp.result_type(d)} {jnp.shape(d)}", "a float32 scalar")
    if as_dtype(out_dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), state.dtype):
        raise invalid_argument("out_dtype", out_dtype, f"jnp.bfloat16, jnp.float16 or {state.dtype}")


def fp8_inputs_attention(call, q8, k8, v8, *, descales, state, out_dtype, lengths=()):
    """(O in out_dtype, or (o8, descale_o) with out_dtype the state's dtype), and the state after the
    forward; differentiating it raises InvalidArgumentError. `lengths`: as fp8_forward's."""
    return _fp8_inputs_call(call, q8, k8, v8, tuple(descales), state, jnp.dtype(out_dtype), tuple(lengths))


def _fp8_inputs_forward(call, q8, k8, v8, descales, state, out_dtype, lengths):
    """The forward of inputs already in FP8: (O in out_dtype, or (o8, descale_o)), and the state
    with V's amax (of the values the FP8 tensor holds), O's scale from it, and the kernel's amaxes."""
    descale_q, descale_k, descale_v = (jnp.asarray(d, jnp.float32).reshape(()) for d in descales)
    amax_v = jnp.max(jnp.abs(v8.astype(jnp.float32))) * descale_v
    state = state._set("amax", ("v",), amax_v[None])
    state, _ = updated(state, (Update("from_amax", "o", source="v"),))  # |O| <= max |V|
    o8, _, state = fp8_forward(call, q8, k8, v8, descales=(descale_q, descale_k, descale_v), state=state,
                               lengths=lengths)
    descale_o = state.descale[SLOT["o"]]
    if jnp.dtype(out_dtype) == state.dtype:
        return (o8, descale_o), state
    return dequantize(o8, descale_o, out_dtype), state


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 6))
def _fp8_inputs_call(call, q8, k8, v8, descales, state, out_dtype, lengths):
    """_fp8_inputs_forward, whose differentiation is refused by name (a traced gradient would
    otherwise meet the FFI call's missing rule, or, with the plain-JAX kernel, give FP8 cotangents)."""
    return _fp8_inputs_forward(call, q8, k8, v8, descales, state, out_dtype, lengths)


def _fp8_inputs_call_fwd(call, q8, k8, v8, descales, state, out_dtype, lengths):
    return _fp8_inputs_forward(call, q8, k8, v8, descales, state, out_dtype, lengths), None


def _fp8_inputs_call_bwd(call, out_dtype, residuals, cotangents):
    raise invalid_argument("q", "a float8 array under differentiation",
                           "bfloat16 or float16 inputs for a gradient (quantized inside): JAX's cotangent of a float8 "
                           "array is float8, with no room for the scale its values need")


_fp8_inputs_call.defvjp(_fp8_inputs_call_fwd, _fp8_inputs_call_bwd)
