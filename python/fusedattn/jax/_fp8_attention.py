"""fusedattn.jax.fp8_attention: the scaling recipes of fusedattn.torch.fp8_attention as functional
state (Fp8State, _fp8_state.py), around the FP8 custom calls (fusedattn/fp8_scales.h).

    state = fp8_state("delayed", history=16)                  # one per attention layer
    o, state = fp8_attention(q, k, v, state, causal=True)      # inference: the forward's updates

In training the gradient with respect to `state` IS the updated state (the forward's updates and the
backward's): overwrite, do not add. A training step under jit:

    @jax.jit
    def step(params, state, x):
        def loss_fn(params, state):
            o, _ = fp8_attention(*project(params, x), state, causal=True)
            return jnp.mean(o.astype(jnp.float32) ** 2)
        loss, (grads, state) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, state)
        return loss, update(params, grads), state          # `state` here is the next step's state

(As Flax's FP8 ops do: the backward's amaxes can only leave a custom_vjp as a cotangent.) So use
each state in one fp8_attention call per step, and differentiate with respect to it: a state that
jax.grad does not reach keeps only its forward's updates, and a state used twice gets the sum.

Where each scale comes from, as in fusedattn.torch's FP8:
  - Q, K, V (and dO in the backward): recipe "current" takes this call's amax; "delayed" takes the
    scale from the amax history (slot 0 the newest), and the amax this call saw enters the history
    after the step.
  - S: fixed at the format's largest value (448 E4M3, 57344 E5M2); O: from V's amax (|O| <= max|V|).
  - dP, dQ, dK, dV (written by the kernels): delayed scaling from the amaxes the kernels report,
    with two bits of headroom, under both recipes. A state whose kernel-written histories are all
    zero has never measured them: its backward runs twice (lax.cond), the first run to measure.
  - O and the gradients are dequantized to q's dtype with the descales their kernels ran with.
Quantizing saturates as fusedattn's kernels do, in one pass XLA fuses (_fp8_state._quantized); each
step's scale updates are _fp8_recipe.py's programs, the ones fusedattn.torch runs.

Inputs already in FP8 (the state's dtype) come with their descales and run the forward only
(_fp8_inputs.py):
    o, state = fp8_attention(q8, k8, v8, state, descales=(dq, dk, dv))   # O in bfloat16
    (o8, descale_o), state = fp8_attention(q8, k8, v8, state, descales=(dq, dk, dv), out_dtype=state.dtype)

backward="model" runs the backward in q's dtype (fusedattn's BF16/FP16 kernels) on the unquantized
inputs, with the FP8 forward's O and statistics. fp8_state(grad_dtype=jnp.float8_e5m2) beside E4M3 is
the hybrid recipe: dO, dP and the gradients in E5M2 (their scales from E5M2's largest value).

Under vmap each mapped element runs its own FP8 calls, with its own amaxes and scales (a state
that meets mapped inputs comes back mapped); under a mesh each call runs on its device's shard of the
batch and heads, as attention() does, and the amaxes its kernels write are the max over the shards,
so the state is the same as unsharded (_partition.py, _batching.py).
"""
import functools
from typing import Tuple

import jax
import jax.numpy as jnp

from .. import _config
from .. import _fp8_recipe as _recipe
from ..errors import invalid_argument
from ._attention_vjp import no_gradient
from ._calls import BACKWARD, Call, as_int32, view
from ._fp8_inputs import fp8_inputs_attention, require_fp8_inputs
from ._fp8_kernels import fp8_forward, fp8_pass, with_backward_amaxes
from ._fp8_state import (FP8_MAX, KERNEL_WRITTEN, SLOT, Fp8State, dequantize, quantize_gradient, quantize_inputs,
                         updated)
from ._kernels import pass_function


def _forward(call, q, k, v, state, lengths):
    q8, k8, v8, state, used = quantize_inputs(state, q, k, v)  # used: the descales the backward undoes
    o8, stats, state = fp8_forward(call, q8, k8, v8, descales=[used[i] for i in range(3)], state=state,
                                   lengths=lengths)
    o = dequantize(o8, used[3], q.dtype)
    return o, state, (q8, k8, v8, o8, stats, used)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fp8_attention(call, model_backward, q, k, v, state, lengths):
    """model_backward: None (the FP8 backward), or (the model-precision Call, its (h_q, h_kv));
    lengths: (seq_len_q, seq_len_kv), int32 [b], with a config of runtime lengths, else ()."""
    o, state, _ = _forward(call, q, k, v, state, lengths)
    return o, state


def _fp8_attention_fwd(call, model_backward, q, k, v, state, lengths):
    o, state, residuals = _forward(call, q, k, v, state, lengths)
    if model_backward is not None:  # the unquantized inputs, with the FP8 forward's O and statistics
        return (o, state), (q, k, v, o, residuals[4], state, lengths)
    return (o, state), residuals + (state, lengths)


def _fp8_attention_bwd(call, model_backward, residuals, cotangents):
    d_o, _ = cotangents  # the returned state's cotangent is not used: the step's state comes out as `state`'s
    if model_backward is not None:
        q, k, v, o, stats, state, lengths = residuals
        model_call, heads = model_backward
        d_q, d_k, d_v = pass_function(BACKWARD, model_call, heads)(q, k, v, o, stats, d_o.astype(o.dtype),
                                                                   *lengths)[:3]
        # The state after the forward: this backward moves nothing.
        return d_q, d_k, d_v, state, tuple(map(no_gradient, lengths))
    q8, k8, v8, o8, stats, used, state, lengths = residuals
    d_o8, state = quantize_gradient(state, d_o)

    def run(state):
        scale, descale = state.scale, state.descale
        return fp8_pass(BACKWARD, call, q8, k8)(q8, k8, v8, o8, stats, d_o8, *lengths, *used,
                                                *(descale[SLOT[n]] for n in ("d_o", "s", "d_p")),
                                                *(scale[SLOT[n]] for n in ("s", "d_p", "d_q", "d_k", "d_v")))

    def measured(state):  # a first backward: its amaxes give the scales of the run that counts
        return updated(with_backward_amaxes(state, run(state)[3:]), _recipe.delayed_updates(KERNEL_WRITTEN))[0]

    state = jax.lax.cond(state._calibrated(), lambda state: state, measured, state)
    d_q8, d_k8, d_v8, *amaxes = run(state)
    # Dequantized with the descales this run used, before the step moves them on.
    grads = [dequantize(g8, state.descale[SLOT[name]], d_o.dtype)
             for g8, name in zip((d_q8, d_k8, d_v8), ("d_q", "d_k", "d_v"))]
    moved = _recipe.delayed_updates(_recipe.moved_after_backward(state.recipe))
    state, _ = updated(with_backward_amaxes(state, amaxes), moved)
    return grads[0], grads[1], grads[2], state, tuple(map(no_gradient, lengths))


_fp8_attention.defvjp(_fp8_attention_fwd, _fp8_attention_bwd)


def fp8_attention(q, k, v, state, *, layout: str = "bshd", causal: bool = False, align: str = "top_left",
                  window: Tuple[int, int] = (-1, -1), scale=None, backward: str = "fp8", descales=None,
                  out_dtype=None, seq_len_q=None, seq_len_kv=None):
    """FP8 attention of q, k, v (bfloat16 or float16, one dtype, in a dense `layout`: "bshd", "sbhd"
    or "bhsd") with the scaling `state` (Fp8State, from fp8_state()); returns (O in q's dtype, the
    state after the forward). Differentiable in q, k, v and `state`, whose gradient is the state
    after the whole step (module docstring). causal, window, align and scale as in attention().
    What cuDNN's FP8 kernels do not take on this GPU raises NotSupportedError with every reason
    while tracing (on Hopper: head dim 128 for the backward, no bottom-right diagonal).
    backward: "fp8" (cuDNN's FP8 backward) or "model" (fusedattn's backward in q's dtype on the
    unquantized inputs, with the FP8 forward's O and statistics; the state then keeps the forward's
    updates only).

    Inputs already in FP8 (the state's dtype) take descales=(descale_q, descale_k, descale_v),
    float32 scalars (x = x8 * descale), and run the forward only: O comes back in out_dtype
    (default bfloat16), or, with out_dtype the state's dtype, as (o8, descale_o). Differentiating
    such a call raises InvalidArgumentError: a float8 array's cotangent is float8 in JAX, with no room
    for the scale its values need, so training passes bfloat16 or float16 inputs (quantized inside,
    by the same kernels). fusedattn.torch.Fp8Tensor is PyTorch's way round it.

    seq_len_q and seq_len_kv (integer [b], together) make each entry's lengths runtime data, as in
    attention(): O and the gradients are zero past them (the amaxes are the whole arrays')."""
    if not isinstance(state, Fp8State):
        raise invalid_argument("state", type(state).__name__, "a fusedattn.jax.Fp8State")
    if backward not in ("fp8", "model"):
        raise invalid_argument("backward", backward, '"fp8" or "model"')
    fp8_inputs = jnp.dtype(q.dtype) in FP8_MAX
    if fp8_inputs:
        out_dtype = jnp.bfloat16 if out_dtype is None else out_dtype
        require_fp8_inputs(q, k, v, state, descales=descales, out_dtype=out_dtype)
    elif jnp.dtype(q.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise invalid_argument("q.dtype", q.dtype,
                               "jnp.bfloat16 or jnp.float16 (quantized inside), or the state's FP8 dtype with descales")
    elif descales is not None or out_dtype not in (None, q.dtype):
        field = "descales" if descales is not None else "out_dtype"
        raise invalid_argument(field, "given", f"not given for {q.dtype} inputs (O comes back in q's dtype)")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise invalid_argument(f"{name}.dtype", x.dtype, f"q's dtype, {q.dtype}")
    _config.require_arrays(ragged=False, sink=None, softmax="vanilla", seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                           cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=0, max_seqlen_kv=0)
    lengths = tuple(map(as_int32, (seq_len_q, seq_len_kv))) if seq_len_q is not None else ()
    fp8_grads = _recipe.fp8_grads(state.format) if backward == "fp8" else ""  # the model backward has none
    config = _config.config(layout, causal=causal, window=tuple(window), align=align, fp8_grads=fp8_grads,
                            padding=bool(lengths))
    spec = config.spec(*((state.dtype.name,) + view(x)[1:] for x in (q, k, v)), 0, 0, 0)
    if lengths:  # what the handlers read by address: one each of the spec's sequences
        _config.require_lengths(spec, seq_len_q=lengths[0], seq_len_kv=lengths[1])
    call = Call(config, spec.default_scale if scale is None else float(scale), fp8=True)
    if fp8_inputs:
        return fp8_inputs_attention(call, q, k, v, descales=descales, state=state, out_dtype=out_dtype,
                                    lengths=lengths)
    model_backward = None
    if backward == "model":
        model_spec = config.spec(view(q), view(k), view(v), 0, 0, 0)  # the same call in q's dtype
        model_backward = (Call(config, call.scale), (model_spec.heads_q, model_spec.heads_kv))
    return _fp8_attention(call, model_backward, q, k, v, state, lengths)
