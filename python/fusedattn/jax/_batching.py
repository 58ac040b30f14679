"""vmap for fusedattn.jax's calls (jax.custom_batching.custom_vmap).

A plain dense call (no bias, sink or dropout) folds the mapped axis into the batch: one call on
n·b entries instead of n calls, split apart again after; nested vmaps fold in turn. A call with
per-call state that folding would change runs once per mapped element instead (jax.lax.map):
dropout (each element must get the mask its key gives it alone), bias and sink (their gradients
are sums over the batch, per element), a max logit (a head's is a max over the batch), runtime
lengths, packed sequences (thd), paged caches and FP8 calls (the amaxes their kernels write are
each element's own, and so are the scales a mapped state gives them).
"""
import jax
import jax.numpy as jnp

from .. import _config
from ._calls import STATS


def _batch_axis(role, layout):
    return 0 if role == STATS else _config.AXES[layout][0]


def fold(x, axis):
    """[n, ...] with the batch at `axis` of the unmapped array -> that array with n·b entries."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2:])


def unfold(x, n, axis):
    x = x.reshape(x.shape[:axis] + (n, x.shape[axis] // n) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


def foldable(call):
    c = call.config
    return not (call.ragged or c.dropout > 0.0 or c.softmax == "sink" or c.bias != "none" or c.padding
                or c.kv_pages or c.max_logit != "none" or c.score_mod  # a modifier's b index: its own batch
                or call.fp8)


def with_batching(kernel, pass_, call):
    """`kernel(*arrays)` (a call of `pass_`) with its vmap rule."""
    inputs, outputs = call.inputs(pass_), call.outputs(pass_)
    single = len(outputs) == 1
    layout = call.config.layout

    @jax.custom_batching.custom_vmap
    def batched(*args):
        return kernel(*args)

    @batched.def_vmap
    def rule(axis_size, in_batched, *args):
        if foldable(call):
            args = [x if mapped else jnp.broadcast_to(x, (axis_size,) + x.shape) for x, mapped in zip(args, in_batched)]
            out = batched(*(fold(x, _batch_axis(role, layout)) for x, role in zip(args, inputs)))
            out = (out,) if single else out
            out = tuple(unfold(y, axis_size, _batch_axis(role, layout)) for y, role in zip(out, outputs))
        else:
            mapped = [x for x, m in zip(args, in_batched) if m]

            def one(elements):
                elements = iter(elements)
                return batched(*(next(elements) if m else x for x, m in zip(args, in_batched)))
            out = jax.lax.map(one, mapped)
            out = (out,) if single else tuple(out)
        return (out[0], True) if single else (out, (True,) * len(out))

    return batched
