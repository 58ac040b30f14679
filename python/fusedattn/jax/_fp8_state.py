"""fusedattn.jax's FP8 scaling state (Fp8State, a pytree, one per attention layer), its fresh value
(fp8_state), and the steps that move it: quantizing a tensor, and a recipe's scales from amaxes
(the recipes themselves: fusedattn/_fp8_recipe.py, shared with fusedattn.torch)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .. import _core as core
from .. import _fp8_recipe as _recipe
from ..errors import invalid_argument

TENSORS, SLOT, KERNEL_WRITTEN = _recipe.TENSORS, _recipe.SLOT, _recipe.KERNEL_WRITTEN
# The FP8 dtypes a state takes, each with its largest finite value.
FP8_MAX = {jnp.dtype(d): core.fp8_max(jnp.dtype(d).name) for d in (jnp.float8_e4m3fn, jnp.float8_e5m2)}
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
        return np.array([FP8_MAX[self.dtype_of(n)] for n in names], np.float32)

    def _set(self, field, names, values):
        at = np.array([SLOT[n] for n in names])
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
        at = np.array([SLOT[n] for n in names])
        history = jnp.concatenate([self.amax[at][:, None], self.history[at, :-1]], axis=1)
        state = dataclasses.replace(self, history=self.history.at[at].set(history))
        return state._scaled(names, history.max(axis=1))

    def _calibrated(self):
        return jnp.any(self.history[np.array([SLOT[n] for n in KERNEL_WRITTEN])] != 0)


jax.tree_util.register_dataclass(Fp8State, data_fields=["scale", "descale", "amax", "history"],
                                 meta_fields=["recipe", "margin", "dtype", "grad_dtype"])


def fp8_state(recipe="delayed", history=16, margin=0, dtype=jnp.float8_e4m3fn, grad_dtype=None):
    """A fresh Fp8State: scales 1, S's scale the format's largest value, histories zero. grad_dtype:
    the FP8 backward's dO and gradients, dtype's by default, or jnp.float8_e5m2 beside E4M3 (the
    hybrid recipe)."""
    _recipe.require_recipe(recipe)
    if as_dtype(dtype) not in FP8_MAX:
        raise invalid_argument("dtype", dtype, "jnp.float8_e4m3fn or jnp.float8_e5m2")
    grad_dtype = dtype if grad_dtype is None else grad_dtype
    if _recipe.format_name(_NAMES[jnp.dtype(dtype)], _NAMES.get(as_dtype(grad_dtype))) is None:
        raise invalid_argument("grad_dtype", grad_dtype,
                               "jnp.float8_e5m2 beside jnp.float8_e4m3fn (the hybrid recipe), or dtype")
    _recipe.require_history(history)
    dtype, n = jnp.dtype(dtype), len(TENSORS)
    largest = FP8_MAX[dtype]
    scale = jnp.ones(n, jnp.float32).at[SLOT["s"]].set(largest)
    return Fp8State(scale, 1.0 / scale, jnp.zeros(n, jnp.float32), jnp.zeros((n, int(history)), jnp.float32),
                    recipe, int(margin), dtype, jnp.dtype(grad_dtype))


def as_dtype(dtype):
    """`dtype` as a jnp.dtype, or None where it is not a dtype at all."""
    try:
        return jnp.dtype(dtype)
    except TypeError:
        return None


def updated(state, updates):
    """The state after a step's `updates` (_fp8_recipe.Update, in order), and the descales they
    report ([4], _fp8_recipe.USED; zeros where none reports)."""
    used = [jnp.zeros((), jnp.float32)] * len(_recipe.USED)
    for u in updates:
        if u.used is not None:
            used[u.used] = state.descale[SLOT[u.tensor]]
        if u.rule == "from_amax":
            state = state._scaled((u.tensor,), state.amax[SLOT[u.amax_of]][None])
        elif u.rule == "delayed":
            state = state._advance((u.tensor,))
    return state, jnp.stack(used)


def _quantized(state, name, x):
    """x in FP8 with its slot's scale: clip(x * scale, -max, max) in float32, converted (XLA fuses it
    into one pass; the clip saturates as fusedattn's kernels do, NaN stays NaN)."""
    scale, largest = state.scale[SLOT[name]], float(state.fp8_max((name,))[0])
    return jnp.clip(x.astype(jnp.float32) * scale, -largest, largest).astype(state.dtype_of(name))


def _with_amaxes(state, names, xs):
    return state._set("amax", names, jnp.stack([jnp.max(jnp.abs(x)).astype(jnp.float32) for x in xs]))


def quantize_inputs(state, q, k, v):
    """Q, K and V in FP8 by the recipe, with the state after the forward's updates
    (_fp8_recipe.forward_updates: O's scale from V's amax among them) and the descales of Q, K, V
    and O the forward uses. Current scaling sets the scales from this call's amaxes first; delayed
    quantizes with the last step's and moves them on after."""
    state = _with_amaxes(state, tuple("qkv"), (q, k, v))
    if state.recipe == "current":
        state, used = updated(state, _recipe.forward_updates("current"))
        return tuple(_quantized(state, n, x) for n, x in zip("qkv", (q, k, v))) + (state, used)
    q8, k8, v8 = (_quantized(state, n, x) for n, x in zip("qkv", (q, k, v)))
    state, used = updated(state, _recipe.forward_updates("delayed"))
    return q8, k8, v8, state, used


def quantize_gradient(state, d_o):
    """dO in the gradients' FP8 by the recipe, and the state with its amax (and, current scaling,
    its scale: _fp8_recipe.gradient_updates)."""
    state, _ = updated(_with_amaxes(state, ("d_o",), (d_o,)), _recipe.gradient_updates(state.recipe))
    return _quantized(state, "d_o", d_o), state


def dequantize(x8, descale, dtype):
    return (x8.astype(jnp.float32) * descale).astype(dtype)
