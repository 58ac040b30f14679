"""fusedattn.jax.context_parallel_attention: attention over sequences split across the devices of a
mesh axis, inside jax.shard_map, by ring (jax.lax.ppermute) or all-gather (jax.lax.all_gather),
built on the core's forward and backward and their log-sum-exp:

    mesh = jax.make_mesh((4,), ("cp",))
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P(None, "cp"), out_specs=P(None, "cp"))
    def attend(q, k, v):                      # each device: its part of the sequence axis (bshd)
        return fusedattn.jax.context_parallel_attention(q, k, v, axis_name="cp", causal=True)
    o = attend(*(load_balance(x, 4) for x in (q, k, v)))   # then unbalance(o, 4)

Causal attention with load_balanced=True (the default) wants device r to hold chunks r and 2N-1-r
of every sequence (load_balance arranges an array so), which gives every device the same causal
work; load_balanced=False takes chunk r on device r. The forward merges each block's O by its
log-sum-exp. The backward runs each block's backward with the merged O and statistics, which makes
each block's dS exact, and sums dK, dV where their block lives: in the ring the sums travel with
the blocks and take one more step home; with all-gather they are reduce-scattered. A block a causal
mask hides entirely is skipped, and a row that sees no key of a block takes a neutral statistic
(-inf: weight 0). The ring sends the next block before computing the current one, so XLA can hide
the transfer behind the attention.

A learnable sink joins each row once, after the blocks; its gradient is summed over the devices.
A sliding window (causal, or two-sided) runs each chunk of queries against each chunk of keys as
a window piece (fusedattn/_context_parallel.py), its kind switched on from the traced device
indices: hidden, the diagonal, full, or a band the score modifier _cp.BAND or _cp.BAND_BELOW masks.
Packed sequences (thd, cu_seqlens) are split sequence by sequence (fusedattn/_context_parallel.py
says how), each piece one ragged call over every sequence, under a window with each sequence's band
(_cp.BANDS_PER_SEQUENCE, its kind switched on as the dense pieces' are). Not yet: dense lengths.

Here: the public call and its custom_vjp; beneath it, _context_parallel_schemes (ring, all-gather)
-> _context_parallel_pieces (a block's pieces) -> _context_parallel_blocks (the block calls and the
merge), and _context_parallel_order (load_balance, unbalance, packed orders).
"""
import functools

import jax
import jax.numpy as jnp

from .. import _context_parallel as _cp
from .._merge import rows
from ..errors import invalid_argument
from ._attention_vjp import no_gradient
from ._context_parallel_blocks import merge, neutral
from ._context_parallel_order import JnpOps, checked_offsets
from ._context_parallel_pieces import BlockSchedule
from ._context_parallel_schemes import SCHEMES


def _sink_partial(q, sink):
    """A learnable sink's share of every row: no value, the logit sink[h], counted once after the
    blocks so that no block adds it again."""
    o, stats = neutral(q)
    return o, rows(jnp.broadcast_to(jnp.asarray(sink, jnp.float32), rows(stats).shape))


def _forward_all(schedule, scheme, q, k, v, sink, offsets):
    out = SCHEMES[scheme].forward(schedule, q, k, v, offsets=offsets)
    return out if sink is None else merge(out, _sink_partial(q, sink))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _context_parallel(schedule, scheme, q, k, v, sink, offsets):
    o, _ = _forward_all(schedule, scheme, q, k, v, sink, offsets)
    return o.astype(q.dtype)


def _context_parallel_fwd(schedule, scheme, q, k, v, sink, offsets):
    o, stats = _forward_all(schedule, scheme, q, k, v, sink, offsets)
    o = o.astype(q.dtype)
    return o, (q, k, v, o, stats, sink, offsets)


def _context_parallel_bwd(schedule, scheme, residuals, d_o):
    q, k, v, o, stats, sink, offsets = residuals
    d_o = d_o.astype(o.dtype)
    d_q, d_k, d_v = SCHEMES[scheme].backward(schedule, q, k, v, o, stats, d_o, offsets=offsets)
    d_sink = None
    if sink is not None:  # -sum over rows of P_sink * rowsum(dO * O), summed over the devices
        row_sums = (d_o.astype(jnp.float32) * o.astype(jnp.float32)).sum(-1)  # O's rows: [b, s, h] or [tokens, h]
        p_sink = jnp.exp(jnp.asarray(sink, jnp.float32) - rows(stats))
        local = -(p_sink * row_sums).reshape(-1, row_sums.shape[-1]).sum(0)
        d_sink = jax.lax.psum(local, schedule.axis).astype(jnp.asarray(sink).dtype)
    return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), d_sink, no_gradient(offsets)


_context_parallel.defvjp(_context_parallel_fwd, _context_parallel_bwd)


def context_parallel_attention(q, k, v, *, axis_name, causal=False, window=(-1, -1), scheme="ring",
                               load_balanced=True, scale=None, sink=None, cu_seqlens=None, max_seqlen=0):
    """Attention of this device's queries against the keys of every device of mesh axis
    `axis_name`, inside jax.shard_map; q, k, v are this device's parts of the sequence axis, bshd
    (GQA: h_q a multiple of h_kv). scheme: "ring" (each block passed on to the next device) or
    "all_gather". Causal with load_balanced: device r holds chunks r and 2N-1-r (load_balance);
    otherwise chunk r. window=(W, 0) (or (W, -1) with causal): a causal sliding window of W keys
    (the diagonal's among them, as in attention()), in positions of the whole sequence; with
    causal=False, (L, R): L keys up to the diagonal and R after it (-1: no bound), the devices
    holding contiguous chunks. sink: a learnable sink's logits [h_q], replicated over the axis
    (softmax="sink"). Differentiable in q, k, v and the sink (the module's docstring says how).
    cu_seqlens: a packed batch (thd): q, k, v [tokens, h, d] are this device's part (load_balance
    with cu_seqlens: chunks r and 2N-1-r of every sequence, or chunk r without load balancing),
    cu_seqlens the whole batch's int32 [b + 1] offsets, replicated, each length a multiple of 2N
    (N), and max_seqlen (static) at least its longest sequence."""
    packed = cu_seqlens is not None
    window, causal, balanced, scale = _cp.call_options(q.shape, k.shape, window=window, causal=causal,
                                                       load_balanced=load_balanced, scheme=scheme, holder="device",
                                                       packed=packed, scale=scale)
    if not packed:
        schedule = BlockSchedule(axis_name=axis_name, causal=bool(causal), balanced=balanced, scale=scale,
                                 window=window)
        return _context_parallel(schedule, scheme, q, k, v, sink, None)
    n = jax.lax.axis_size(axis_name)
    if int(max_seqlen) < 1:
        raise invalid_argument("max_seqlen", max_seqlen, "the longest sequence's tokens (at least 1) with cu_seqlens")
    chunks = 2 * n if balanced else n
    cu = checked_offsets(cu_seqlens, n, balanced=balanced)
    schedule = BlockSchedule(axis_name=axis_name, causal=bool(causal), balanced=balanced, scale=scale, window=window,
                             longest=-(-int(max_seqlen) // chunks))
    _, half = _cp.packed_sizes(cu, n, balanced=balanced)
    if not balanced:
        return _context_parallel(schedule, scheme, q, k, v, sink, half)
    tokens = q.shape[0]
    order = _cp.halves_order(cu, n, tokens, positions=jnp.arange(tokens), ops=JnpOps)
    halves = lambda x: jnp.take(x, order, axis=0)
    o = _context_parallel(schedule, scheme, halves(q), halves(k), halves(v), sink, half)
    return jnp.zeros_like(o).at[order].set(o)
