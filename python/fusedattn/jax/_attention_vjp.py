"""attention()'s differentiation: a jax.custom_vjp over the core's forward and backward calls, with
the forward's O and statistics as the backward's residuals."""
import functools

import jax
import jax.numpy as jnp

from ._calls import BACKWARD, FORWARD
from ._kernels import pass_function


def differentiable_attention(calls, heads, q, k, v, *, bias=None, sink=None, rng=None, lengths=(), offsets=(),
                             mods=()):
    """(O, the max logit where asked for, else None), differentiable in q, k, v, bias and sink.
    calls: the Call of a forward nobody differentiates (no statistics) and the Call the forward and
    backward of training share; heads: (h_q, h_kv). rng: dropout's seed and offset; lengths:
    (seq_len_q, seq_len_kv) or (); offsets: (cu_seqlens_q, cu_seqlens_kv) or (); mods: a score
    modifier's scalars and tensors (not differentiated)."""
    return _attention(calls, heads, q, k, v, bias, sink, rng, tuple(lengths), tuple(offsets), tuple(mods))


def _present(*arrays):
    return tuple(x for x in arrays if x is not None)


def no_gradient(x):
    """The cotangent of an integer input (dropout's rng, lengths, offsets): float0 zeros, None for none."""
    return None if x is None else jnp.zeros(x.shape, jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attention(calls, heads, q, k, v, bias, sink, rng, lengths, offsets, mods):
    optional = _present(bias, sink, rng, *lengths, *offsets, *mods)
    out = pass_function(FORWARD, calls[0], heads)(q, k, v, *optional)
    return tuple(out) if calls[0].config.max_logit != "none" else (out, None)


def _attention_fwd(calls, heads, q, k, v, bias, sink, rng, lengths, offsets, mods):
    optional = _present(bias, sink, rng, *lengths, *offsets, *mods)
    o, stats, *max_logit = pass_function(FORWARD, calls[1], heads)(q, k, v, *optional)
    return (o, max_logit[0] if max_logit else None), (q, k, v, o, stats, bias, sink, rng, lengths, offsets, mods)


def _attention_bwd(calls, heads, residuals, cotangents):
    d_o, _ = cotangents  # the max logit is not differentiated
    q, k, v, o, stats, bias, sink, rng, lengths, offsets, mods = residuals
    optional = _present(bias, sink, rng, *lengths, *offsets, *mods)
    grads = pass_function(BACKWARD, calls[1], heads)(q, k, v, o, stats, d_o.astype(o.dtype), *optional)
    d_q, d_k, d_v, *rest = grads
    d_bias = rest.pop(0) if calls[1].config.bias_grad else (None if bias is None else jnp.zeros_like(bias))
    d_sink = rest.pop(0) if sink is not None else None
    return (d_q, d_k, d_v, d_bias, d_sink, no_gradient(rng), tuple(map(no_gradient, lengths)),
            tuple(map(no_gradient, offsets)), tuple(jnp.zeros_like(x) for x in mods))


_attention.defvjp(_attention_fwd, _attention_bwd)
