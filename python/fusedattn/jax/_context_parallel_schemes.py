"""How the blocks of keys reach each device in context parallelism, forward and backward: a ring
(jax.lax.ppermute, the next block sent while this one runs) or an all-gather (dK, dV
reduce-scattered home). Each device's blocks run through its BlockSchedule."""
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from ._context_parallel_blocks import merge, neutral


class Scheme(NamedTuple):
    """forward(schedule, q, k, v, *, offsets) -> (O float32, statistics), merged over every block;
    backward(schedule, q, k, v, o, stats, d_o, *, offsets) -> (dQ, dK, dV) float32, each device's."""
    forward: Callable
    backward: Callable


def _ring_permutation(n):
    return [(i, (i + 1) % n) for i in range(n)]


def _ring_forward(schedule, q, k, v, *, offsets):
    n, rank = jax.lax.axis_size(schedule.axis), jax.lax.axis_index(schedule.axis)
    out, kv = neutral(q), (k, v)
    for t in range(n):  # at step t the keys of device rank - t
        if t < n - 1:  # sent before this step's block runs, so that the transfer can hide behind it
            incoming = jax.lax.ppermute(kv, schedule.axis, _ring_permutation(n))
        out = merge(out, schedule.block_forward(q, *kv, rank=rank, source=(rank - t) % n, offsets=offsets))
        if t < n - 1:
            kv = incoming
    return out


def _ring_backward(schedule, q, k, v, o, stats, d_o, *, offsets):
    n, rank = jax.lax.axis_size(schedule.axis), jax.lax.axis_index(schedule.axis)
    d_q = jnp.zeros(q.shape, jnp.float32)
    kv, d_kv = (k, v), (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    for t in range(n):
        if t < n - 1:
            incoming = jax.lax.ppermute(kv, schedule.axis, _ring_permutation(n))
        dq_t, dk_t, dv_t = schedule.block_backward(q, *kv, o, stats, d_o, rank=rank, source=(rank - t) % n,
                                                   offsets=offsets)
        d_q = d_q + dq_t
        # A block's dK, dV sums travel with it; after the last step one more hop brings them home.
        d_kv = jax.lax.ppermute((d_kv[0] + dk_t, d_kv[1] + dv_t), schedule.axis, _ring_permutation(n))
        if t < n - 1:
            kv = incoming
    return d_q, d_kv[0], d_kv[1]


def _gathered(schedule, x):
    n = jax.lax.axis_size(schedule.axis)
    return jnp.split(jax.lax.all_gather(x, schedule.axis, axis=schedule.tokens, tiled=True), n, axis=schedule.tokens)


def _all_gather_forward(schedule, q, k, v, *, offsets):
    n, rank = jax.lax.axis_size(schedule.axis), jax.lax.axis_index(schedule.axis)
    ks, vs = _gathered(schedule, k), _gathered(schedule, v)
    out = neutral(q)
    for source in range(n):
        out = merge(out, schedule.block_forward(q, ks[source], vs[source], rank=rank, source=source, offsets=offsets))
    return out


def _all_gather_backward(schedule, q, k, v, o, stats, d_o, *, offsets):
    n, rank = jax.lax.axis_size(schedule.axis), jax.lax.axis_index(schedule.axis)
    ks, vs = _gathered(schedule, k), _gathered(schedule, v)
    d_q, d_ks, d_vs = jnp.zeros(q.shape, jnp.float32), [], []
    for source in range(n):
        dq_s, dk_s, dv_s = schedule.block_backward(q, ks[source], vs[source], o, stats, d_o, rank=rank, source=source,
                                                   offsets=offsets)
        d_q, d_ks, d_vs = d_q + dq_s, d_ks + [dk_s], d_vs + [dv_s]
    scatter = lambda parts: jax.lax.psum_scatter(jnp.concatenate(parts, axis=schedule.tokens), schedule.axis,
                                                 scatter_dimension=schedule.tokens, tiled=True)
    return d_q, scatter(d_ks), scatter(d_vs)


SCHEMES = {"ring": Scheme(forward=_ring_forward, backward=_ring_backward),
           "all_gather": Scheme(forward=_all_gather_forward, backward=_all_gather_backward)}
