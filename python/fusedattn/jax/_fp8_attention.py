"""fusedattn.jax's FP8 attention: the scaling recipes of fusedattn.torch.fp8_attention (_torch_fp8.py)
as functional state, around the FP8 custom calls (fusedattn/fp8_scales.h).

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

Where each scale comes from, as in _torch_fp8.py:
  - Q, K, V (and dO in the backward): recipe "current" takes this call's amax; "delayed" takes the
    scale from the amax history (slot 0 the newest), and the amax this call saw enters the history
    after the step.
  - S: fixed at the format's largest value (448 E4M3, 57344 E5M2); O: from V's amax (|O| <= max|V|).
  - dP, dQ, dK, dV (written by the kernels): delayed scaling from the amaxes the kernels report,
    with two bits of headroom, under both recipes. A state whose kernel-written histories are all
    zero has never measured them: its backward runs twice (lax.cond), the first run to measure.
  - O and the gradients are dequantized to q's dtype with the descales their kernels ran with.
Quantizing is clip(x * scale, -max, max) in float32, converted to FP8 (XLA fuses it into one pass;
the clip saturates as fusedattn's kernels do, NaN stays NaN).

Inputs already in FP8 (the state's dtype) come with their descales and run the forward only:
    o, state = fp8_attention(q8, k8, v8, state, descales=(dq, dk, dv))   # O in bfloat16
    (o8, descale_o), state = fp8_attention(q8, k8, v8, state, descales=(dq, dk, dv), out_dtype=state.dtype)

backward="model" runs the backward in q's dtype (fusedattn's BF16/FP16 kernels) on the unquantized
inputs, with the FP8 forward's O and statistics. fp8_state(grad_dtype=jnp.float8_e5m2) beside E4M3 is
the hybrid recipe: dO, dP and the gradients in E5M2 (their scales from E5M2's largest value).

Under vmap each mapped element runs its own FP8 calls, with its own amaxes and scales (a state
that meets mapped inputs comes back mapped); under a mesh each call runs on its device's shard of the
batch and heads, as attention() does, and the amaxes its kernels write are the max over the shards,
so the state is the same as unsharded (_jax_partition.py, _jax_batching.py).
"""
import dataclasses
import functools
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _config
from .. import _fp8_recipe as _recipe
from .. import _core as core
from ._calls import AXES, BACKWARD, FORWARD, Call, view
from ..errors import invalid_argument

__all__ = ["Fp8State", "fp8_state", "fp8_attention"]

TENSORS, _SLOT, _KERNEL_WRITTEN = _recipe.TENSORS, _recipe.SLOT, _recipe.KERNEL_WRITTEN
_DTYPES = {jnp.dtype(d): core.fp8_max(jnp.dtype(d).name) for d in (jnp.float8_e4m3fn, jnp.float8_e5m2)}
_NAMES = {jnp.dtype(jnp.float8_e4m3fn): "e4m3", jnp.dtype(jnp.float8_e5m2): "e5m2"}  # _fp8_recipe.FORMATS' words
_FLT_MIN, _FLT_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True, eq=False)  # eq on arrays would be ambiguous
class Fp8State:
    """The scaling state of one attention layer, a pytree of float32 arrays indexed by TENSORS:
    scale, descale and amax [10] (the last amax seen), history [10, length] (slot 0 the newest).
    recipe ("current" or "delayed"), margin (scales are divided by 2^margin), dtype and grad_dtype
    (the FP8 backward's dO and gradients) are static."""
    scale: jax.Array
    descale: jax.Array
    amax: jax.Array
    history: jax.Array
    recipe: str = "delayed"
    margin: int = 0
    dtype: jnp.dtype = jnp.dtype(jnp.float8_e4m3fn)
    grad_dtype: jnp.dtype = jnp.dtype(jnp.float8_e4m3fn)

    @property
    def format(self):
        """The format's name (_fp8_recipe.FORMATS): "e4m3", "e5m2" or "hybrid"."""
        return _recipe.format_name(_NAMES[self.dtype], _NAMES[self.grad_dtype])

    def dtype_of(self, name):
        """The FP8 dtype of tensor `name`'s slot: the gradients' for dO, dP and the gradients."""
        return self.grad_dtype if name in _recipe.GRADIENTS else self.dtype

    def fp8_max(self, names):
        return np.array([_DTYPES[self.dtype_of(n)] for n in names], np.float32)

    def _set(self, field, names, values):
        at = np.array([_SLOT[n] for n in names])
        return dataclasses.replace(self, **{field: getattr(self, field).at[at].set(values)})

    def _scaled(self, names, amaxes):
        """`names`' scales and descales set from `amaxes`, as fusedattn's scale_from_amax: 1 where an
        amax is 0 or not finite, and clamped to float's range. The margin is the state's, plus the
        headroom for the kernel-written tensors."""
        margin = np.array([_recipe.margin_of(n, self.margin) for n in names], np.int32)
        ok = (amaxes > 0) & jnp.isfinite(amaxes)
        scale = jnp.clip(jnp.ldexp(self.fp8_max(names) / jnp.where(ok, amaxes, 1.0), -margin), _FLT_MIN, _FLT_MAX)
        scale = jnp.where(ok, scale, 1.0)
        return self._set("scale", names, scale)._set("descale", names, 1.0 / scale)

    def _advance(self, names):
        """Delayed scaling's step: each history takes its amax in slot 0, and the scale follows the
        largest amax in it (NaN propagates, giving scale 1)."""
        if not names:
            return self
        at = np.array([_SLOT[n] for n in names])
        history = jnp.concatenate([self.amax[at][:, None], self.history[at, :-1]], axis=1)
        state = dataclasses.replace(self, history=self.history.at[at].set(history))
        return state._scaled(names, history.max(axis=1))

    def _calibrated(self):
        return jnp.any(self.history[np.array([_SLOT[n] for n in _KERNEL_WRITTEN])] != 0)


jax.tree_util.register_dataclass(Fp8State, data_fields=["scale", "descale", "amax", "history"],
                                 meta_fields=["recipe", "margin", "dtype", "grad_dtype"])


def fp8_state(recipe="delayed", history=16, margin=0, dtype=jnp.float8_e4m3fn, grad_dtype=None):
    """A fresh Fp8State: scales 1, S's scale the format's largest value, histories zero. grad_dtype:
    the FP8 backward's dO and gradients, dtype's by default, or jnp.float8_e5m2 beside E4M3 (the
    hybrid recipe)."""
    _recipe.require_recipe(recipe)
    if _dtype(dtype) not in _DTYPES:
        raise invalid_argument("dtype", dtype, "jnp.float8_e4m3fn or jnp.float8_e5m2")
    grad_dtype = dtype if grad_dtype is None else grad_dtype
    if _recipe.format_name(_NAMES[jnp.dtype(dtype)], _NAMES.get(_dtype(grad_dtype))) is None:
        raise invalid_argument("grad_dtype", grad_dtype,
                               "jnp.float8_e5m2 beside jnp.float8_e4m3fn (the hybrid recipe), or dtype")
    _recipe.require_history(history)
    dtype, n = jnp.dtype(dtype), len(TENSORS)
    largest = _DTYPES[dtype]
    scale = jnp.ones(n, jnp.float32).at[_SLOT["s"]].set(largest)
    return Fp8State(scale, 1.0 / scale, jnp.zeros(n, jnp.float32), jnp.zeros((n, int(history)), jnp.float32),
                    recipe, int(margin), dtype, jnp.dtype(grad_dtype))


def _dtype(dtype):
    try:
        return jnp.dtype(dtype)
    except TypeError:  # not a dtype at all
        return None


def _quantize(state, name, x):
    """x in FP8 by the recipe, and the state with its amax (and, current scaling, its scale)."""
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    state = state._set("amax", (name,), amax)
    if state.recipe == "current":
        state = state._scaled((name,), state.amax[_SLOT[name]][None])
    scale, largest = state.scale[_SLOT[name]], float(state.fp8_max((name,))[0])
    x8 = jnp.clip(x.astype(jnp.float32) * scale, -largest, largest).astype(state.dtype_of(name))
    return x8, state


def _dequantize(x8, descale, dtype):
    return (x8.astype(jnp.float32) * descale).astype(dtype)


def _kernel(pass_, call, q, k):
    """The FP8 `pass_` of `call` on q and k's heads, with attention()'s vmap rule and partitioning
    (its kernel from jax.py's _KERNELS: the CUDA call, or what a test put there)."""
    from .. import jax as adapter
    heads = AXES[call.config.layout][1]
    return adapter._call(pass_, call, (q.shape[heads], k.shape[heads]))


def _kernel_forward(call, q8, k8, v8, descales, state):
    """cuDNN's FP8 forward of q8, k8, v8 with their descales: (o8, the statistics, the state with O's
    scale from V's amax, |O| <= max |V|, and the kernel's amaxes of S and O)."""
    state = state._scaled(("o",), state.amax[_SLOT["v"]][None])
    scale, descale = state.scale, state.descale
    o8, stats, amax_s, amax_o = _kernel(FORWARD, call, q8, k8)(q8, k8, v8, *descales, descale[_SLOT["s"]],
                                                               scale[_SLOT["s"]], scale[_SLOT["o"]])
    return o8, stats, state._set("amax", ("s", "o"), jnp.stack([amax_s, amax_o]))


def _forward(call, q, k, v, state):
    q8, state = _quantize(state, "q", q)
    k8, state = _quantize(state, "k", k)
    v8, state = _quantize(state, "v", v)
    o8, stats, state = _kernel_forward(call, q8, k8, v8, [state.descale[_SLOT[n]] for n in "qkv"], state)
    descale = state.descale
    used = descale[np.array([_SLOT[n] for n in ("q", "k", "v", "o")])]  # the backward undoes these
    o = _dequantize(o8, descale[_SLOT["o"]], q.dtype)
    if state.recipe == "delayed":
        state = state._advance(("q", "k", "v"))
    return o, state, (q8, k8, v8, o8, stats, used)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fp8_attention(call, model_backward, q, k, v, state):
    """model_backward: None (the FP8 backward), or (the model-precision Call, its (h_q, h_kv))."""
    o, state, _ = _forward(call, q, k, v, state)
    return o, state


def _fp8_attention_fwd(call, model_backward, q, k, v, state):
    o, state, residuals = _forward(call, q, k, v, state)
    if model_backward is not None:  # the unquantized inputs, with the FP8 forward's O and statistics
        return (o, state), (q, k, v, o, residuals[4], state)
    return (o, state), residuals + (state,)


def _fp8_attention_bwd(call, model_backward, residuals, cotangents):
    d_o, _ = cotangents  # the returned state's cotangent is not used: the step's state comes out as `state`'s
    if model_backward is not None:
        from .. import jax as adapter
        q, k, v, o, stats, state = residuals
        model_call, heads = model_backward
        d_q, d_k, d_v = adapter._call(BACKWARD, model_call, heads)(q, k, v, o, stats, d_o.astype(o.dtype))[:3]
        return d_q, d_k, d_v, state  # the state after the forward: this backward moves nothing
    q8, k8, v8, o8, stats, used, state = residuals
    d_o8, state = _quantize(state, "d_o", d_o)

    def run(state):
        scale, descale = state.scale, state.descale
        return _kernel(BACKWARD, call, q8, k8)(q8, k8, v8, o8, stats, d_o8, *used,
                                               *(descale[_SLOT[n]] for n in ("d_o", "s", "d_p")),
                                               *(scale[_SLOT[n]] for n in ("s", "d_p", "d_q", "d_k", "d_v")))

    def measured(state):  # a first backward: its amaxes give the scales of the run that counts
        return _kernel_amaxes(state, run(state)[3:])._advance(_KERNEL_WRITTEN)

    state = jax.lax.cond(state._calibrated(), lambda state: state, measured, state)
    d_q8, d_k8, d_v8, *amaxes = run(state)
    # Dequantized with the descales this run used, before the step moves them on.
    grads = [_dequantize(g8, state.descale[_SLOT[name]], d_o.dtype)
             for g8, name in zip((d_q8, d_k8, d_v8), ("d_q", "d_k", "d_v"))]
    state = _kernel_amaxes(state, amaxes)._advance(_recipe.moved_after_backward(state.recipe))
    return grads[0], grads[1], grads[2], state


def _kernel_amaxes(state, amaxes):
    """The state with the amaxes a backward reported (amax_d_q, amax_d_k, amax_d_v, amax_d_p)."""
    return state._set("amax", ("d_q", "d_k", "d_v", "d_p"), jnp.stack(list(amaxes)))


_fp8_attention.defvjp(_fp8_attention_fwd, _fp8_attention_bwd)


def _fp8_inputs_forward(call, q8, k8, v8, descales, state, out_dtype):
    """The forward of inputs already in FP8: (O in out_dtype, or (o8, descale_o)), and the state
    with V's amax (of the values the FP8 tensor holds), O's scale from it, and the kernel's amaxes."""
    descale_q, descale_k, descale_v = (jnp.asarray(d, jnp.float32).reshape(()) for d in descales)
    amax_v = jnp.max(jnp.abs(v8.astype(jnp.float32))) * descale_v
    state = state._set("amax", ("v",), amax_v[None])
    o8, _, state = _kernel_forward(call, q8, k8, v8, (descale_q, descale_k, descale_v), state)
    descale_o = state.descale[_SLOT["o"]]
    if jnp.dtype(out_dtype) == state.dtype:
        return (o8, descale_o), state
    return _dequantize(o8, descale_o, out_dtype), state


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 6))
def _fp8_inputs_call(call, q8, k8, v8, descales, state, out_dtype):
    """_fp8_inputs_forward, whose differentiation is refused by name (a traced gradient would
    otherwise meet the FFI call's missing rule, or, with the plain-JAX kernel, give FP8 cotangents)."""
    return _fp8_inputs_forward(call, q8, k8, v8, descales, state, out_dtype)


def _fp8_inputs_call_fwd(call, q8, k8, v8, descales, state, out_dtype):
    return _fp8_inputs_forward(call, q8, k8, v8, descales, state, out_dtype), None


def _fp8_inputs_call_bwd(call, out_dtype, residuals, cotangents):
    raise invalid_argument("q", "a float8 array under differentiation",
                           "bfloat16 or float16 inputs for a gradient (quantized inside): JAX's cotangent of a float8 "
                           "array is float8, with no room for the scale its values need")


_fp8_inputs_call.defvjp(_fp8_inputs_call_fwd, _fp8_inputs_call_bwd)


def _require_fp8_inputs(q, k, v, state, descales, out_dtype):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.dtype(x.dtype) != state.dtype:
            raise invalid_argument(f"{name}.dtype", x.dtype, f"{state.dtype}, the state's format, for every input")
    if not (isinstance(descales, (tuple, list)) and len(descales) == 3):
        raise invalid_argument("descales", type(descales).__name__,
                               "(descale_q, descale_k, descale_v) for FP8 inputs: float32 scalars")
    for name, d in zip(("descale_q", "descale_k", "descale_v"), descales):
        if jnp.size(d) != 1 or jnp.dtype(jnp.result_type(d)) != jnp.dtype(jnp.float32):
            raise invalid_argument(f"descales.{name}", f"{jnp.result_type(d)} {jnp.shape(d)}", "a float32 scalar")
    if _dtype(out_dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), state.dtype):
        raise invalid_argument("out_dtype", out_dtype, f"jnp.bfloat16, jnp.float16 or {state.dtype}")


def fp8_attention(q, k, v, state, *, layout: str = "bshd", causal: bool = False, align: str = "top_left",
                  window: Tuple[int, int] = (-1, -1), scale=None, backward: str = "fp8", descales=None,
                  out_dtype=None):
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
    by the same kernels). fusedattn.torch.Fp8Tensor is PyTorch's way round it."""
    if not isinstance(state, Fp8State):
        raise invalid_argument("state", type(state).__name__, "a fusedattn.jax.Fp8State")
    if backward not in ("fp8", "model"):
        raise invalid_argument("backward", backward, '"fp8" or "model"')
    fp8_inputs = jnp.dtype(q.dtype) in _DTYPES
    if fp8_inputs:
        out_dtype = jnp.bfloat16 if out_dtype is None else out_dtype
        _require_fp8_inputs(q, k, v, state, descales, out_dtype)
    elif jnp.dtype(q.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise invalid_argument("q.dtype", q.dtype,
                               "jnp.bfloat16 or jnp.float16 (quantized inside), or the state's FP8 dtype with descales")
    elif descales is not None or out_dtype not in (None, q.dtype):
        field = "descales" if descales is not None else "out_dtype"
        raise invalid_argument(field, "given", f"not given for {q.dtype} inputs (O comes back in q's dtype)")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise invalid_argument(f"{name}.dtype", x.dtype, f"q's dtype, {q.dtype}")
    fp8_grads = _recipe.fp8_grads(state.format) if backward == "fp8" else ""  # the model backward has none
    config = _config.config(layout, causal=causal, window=tuple(window), align=align, fp8_grads=fp8_grads)
    spec = config.spec(*((state.dtype.name,) + view(x)[1:] for x in (q, k, v)), 0, 0, 0)
    call = Call(config, spec.default_scale if scale is None else float(scale), fp8=True)
    if fp8_inputs:
        return _fp8_inputs_call(call, q, k, v, tuple(descales), state, jnp.dtype(out_dtype))
    model_backward = None
    if backward == "model":
        model_spec = config.spec(view(q), view(k), view(v), 0, 0, 0)  # the same call in q's dtype
        model_backward = (Call(config, call.scale), (model_spec.heads_q, model_spec.heads_kv))
    return _fp8_attention(call, model_backward, q, k, v, state)
