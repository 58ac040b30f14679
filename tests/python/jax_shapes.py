"""Abstract arrays and the program exported for CUDA, for the JAX tests that run without a GPU: no
kernel runs, the custom calls' text (with the spec attribute) is what they look at."""
import jax
import jax.numpy as jnp


def shaped(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


OURS = [jax.export.DisabledSafetyCheck.custom_call(name) for name in ("fusedattn_forward", "fusedattn_backward")]


def exported_text(fn, *args):
    return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=OURS)(*args).mlir_module()
