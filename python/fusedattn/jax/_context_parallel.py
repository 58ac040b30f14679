"""fusedattn.jax's context parallelism: attention over sequences split across the devices of a mesh
axis, inside jax.shard_map, by ring (jax.lax.ppermute) or all-gather (jax.lax.all_gather), built on
the core's forward and backward and their log-sum-exp:

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
a window piece (_context_parallel.py), its kind switched on from the traced device indices:
hidden, the diagonal, full, or a band the score modifier _cp.BAND or _cp.BAND_BELOW masks. Packed
sequences (thd, cu_seqlens) are split sequence by sequence (_context_parallel.py says how), each
piece one ragged call over every sequence, under a window with each sequence's band
(_cp.BANDS_PER_SEQUENCE, its kind switched on as the dense pieces' are). Not yet: dense lengths.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _config
from .. import _context_parallel as _cp
from ._calls import BACKWARD, FORWARD
from ..errors import invalid_argument

__all__ = ["context_parallel_attention", "load_balance", "unbalance"]


def load_balance(x, n, axis=1, *, cu_seqlens=None, balanced=True):
    """x with its `axis` (the sequence) reordered so that its n equal parts, as shard_map splits
    them, hold chunks (r, 2n-1-r) of 2n: part r's causal work is then the same for every r. A
    packed batch (thd: x [tokens, h, d], axis 0, with its cu_seqlens): so that part r holds those
    chunks of every sequence, sequence after sequence; with balanced=False chunk r of n of each."""
    if cu_seqlens is not None:
        return jnp.take(x, _packed_order(cu_seqlens, n, balanced, x.shape[0]), axis=0)
    chunks = jnp.split(x, 2 * n, axis=axis)
    return jnp.concatenate([chunks[c] for c in _cp.load_balanced_order(n)], axis=axis)


def unbalance(x, n, axis=1, *, cu_seqlens=None, balanced=True):
    """The inverse of load_balance."""
    if cu_seqlens is not None:
        return jnp.zeros_like(x).at[_packed_order(cu_seqlens, n, balanced, x.shape[0])].set(x)
    parts, order = jnp.split(x, 2 * n, axis=axis), [None] * (2 * n)
    for position, c in enumerate(_cp.load_balanced_order(n)):
        order[c] = parts[position]
    return jnp.concatenate(order, axis=axis)


# --- packed sequences (thd) ----------------------------------------------------------------------

class _Ops:
    """What _context_parallel's packed orders ask of jnp."""
    where = staticmethod(jnp.where)

    @staticmethod
    def searchsorted(a, v):
        return jnp.searchsorted(a, v, side="right")


def _offsets(cu_seqlens, n, balanced):
    """The whole batch's offsets as int32, checked (_context_parallel.check_packed_offsets): their
    values where they are known, their shape where they are traced."""
    known = None if isinstance(cu_seqlens, jax.core.Tracer) else np.asarray(cu_seqlens).astype(np.int64)
    _cp.check_packed_offsets(tuple(jnp.shape(cu_seqlens)), None if known is None else known.flatten().tolist(), n,
                             balanced, "device")
    return jnp.asarray(cu_seqlens, jnp.int32)


def _packed_order(cu_seqlens, n, balanced, tokens):
    return _cp.packed_order(_offsets(cu_seqlens, n, balanced), n, balanced, tokens, jnp.arange(tokens), _Ops)


class _Blocks:
    """One device's block calls: the core's forward (O and statistics) and backward of q against a
    block of keys under a piece's mask (the kinds of _context_parallel.window_piece): none, the
    diagonal from the top-left (causal, or a window's bounds), or a band j - i >= offset
    (j - i <= offset) as the score modifier _cp.BAND (_cp.BAND_BELOW), whose offset (traced) is its
    runtime scalar."""

    def __init__(self, scale):
        self.scale = scale

    def _kernel(self, pass_, mask, q, k, v, packed):
        # The kernel itself (jax.py's _KERNELS: the CUDA call, or what a test put there): inside
        # shard_map every array is already this device's, so attention()'s partitioning has no part.
        # Returns it with the band's scalar operand, or a packed call's offsets, bound after the arrays.
        from .. import jax as adapter
        causal, window, score_mod = _cp.mask_options(mask)
        config = _config.config("thd" if packed else "bshd", causal=causal, window=window, stats=True,
                                score_mod=score_mod, padding=packed is not None)
        longest = (packed[1], packed[1]) if packed else (0, 0)
        call, _ = adapter._traced(config, self.scale, longest, q, k, v, packed[0].shape[0] - 1 if packed else 0)
        kernel = functools.partial(adapter._kernel(pass_), call)
        if packed and mask[0] == _cp.SEQUENCE_BAND:
            low, high = mask[1]
            return lambda *arrays: kernel(*arrays, packed[0], packed[0], low, high)
        if packed:
            return lambda *arrays: kernel(*arrays, packed[0], packed[0])
        if mask[0] not in (_cp.BAND_PIECE, _cp.BAND_UPPER):
            return kernel
        scalars = jnp.reshape(jnp.asarray(mask[1], jnp.float32), (1,))
        return lambda *arrays: kernel(*arrays, scalars)

    def forward(self, q, k, v, mask, packed=None):
        """(O in float32, statistics [b, h, s_q], or [tokens, h] packed). `packed`: (offsets of
        each half's sequences, the longest one's tokens) for halves of packed parts (thd)."""
        o, stats = self._kernel(FORWARD, mask, q, k, v, packed)(q, k, v)
        return o.astype(jnp.float32), stats

    def backward(self, q, k, v, o, stats, d_o, mask, packed=None):
        d_q, d_k, d_v = self._kernel(BACKWARD, mask, q, k, v, packed)(q, k, v, o, stats, d_o)
        return d_q.astype(jnp.float32), d_k.astype(jnp.float32), d_v.astype(jnp.float32)


def _zeros_like(x):
    """Float32 zeros of x's shape, made from x so that inside shard_map they vary over the mesh axis
    as x does (lax.switch wants its branches' results typed alike)."""
    return x.astype(jnp.float32) * 0.0


def _neutral(q):
    """No keys seen: O 0, statistics -inf ([b, h, s] for bshd q, [tokens, h] for packed q)."""
    return _zeros_like(q), _rows(_zeros_like(q[..., 0])) - jnp.inf


def _rows(stats):
    """Statistics in O's order of rows ([b, h, s] <-> [b, s, h]); packed ones ([tokens, h]) are."""
    return jnp.transpose(stats, (0, 2, 1)) if stats.ndim == 3 else stats


def _merge(a, b):
    """Two partial results (O float32 [b, s, h, d], statistics [b, h, s]) of the same rows over
    disjoint keys, as one. A row that saw no key of a part (statistic -inf, or not finite at all: a
    band piece's row left of its band) takes nothing from it, whatever its O holds there."""
    (o_a, lse_a), (o_b, lse_b) = a, b
    finite_a, finite_b = jnp.isfinite(lse_a), jnp.isfinite(lse_b)
    lse = jnp.logaddexp(jnp.where(finite_a, lse_a, -jnp.inf), jnp.where(finite_b, lse_b, -jnp.inf))
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    rows = lambda x: _rows(x)[..., None]  # O's rows, and its last axis

    def weighted(o, x, finite):
        w = jnp.where(finite, jnp.exp(jnp.where(finite, x, 0.0) - safe), 0.0)
        return jnp.where(rows(finite), o * rows(w), 0.0)
    return weighted(o_a, lse_a, finite_a) + weighted(o_b, lse_b, finite_b), lse


def _part(x, part, axis=1):
    """`part` of x's `axis`; all of it is x itself (no slice for XLA to see)."""
    if part == _cp.ALL:
        return x
    start, stop = _cp.span(part, x.shape[axis])
    return jax.lax.slice_in_dim(x, start, stop, axis=axis)


def _put(x, part, axis, value, add=False):
    """x with `part` of its `axis` set to (or, add: increased by) value; all of it is value itself
    (or x + value), not an update of the whole array."""
    if part == _cp.ALL:
        return x + value if add else value
    start, stop = _cp.span(part, x.shape[axis])
    index = (slice(None),) * axis + (slice(start, stop),)
    return x.at[index].add(value) if add else x.at[index].set(value)


def _present(x):
    return () if x is None else (x,)


def _window_kind(m, chunk, bounds):
    """_context_parallel.window_piece on traced chunk distances: (switch index, band offset)."""
    left, right = bounds
    low, high = m * chunk - left + 1, m * chunk + right
    no = jnp.zeros(jnp.shape(m), bool)
    hidden = (low >= chunk if left >= 0 else no) | (high <= -chunk if right >= 0 else no)
    lower = low > -(chunk - 1) if left >= 0 else no
    upper = high < chunk - 1 if right >= 0 else no
    kind = jnp.where(hidden, _cp.HIDDEN, jnp.where(m == 0, _cp.DIAGONAL, jnp.where(
        lower, _cp.BAND_PIECE, jnp.where(upper, _cp.BAND_UPPER, _cp.FULL))))
    return kind.astype(jnp.int32), jnp.where(kind == _cp.BAND_UPPER, high, low)


def _varying_axes(x):
    """The mesh axes x varies over inside shard_map (JAX 0.11: the type's manual_axis_type; 0.10:
    its vma), or None where JAX tracks none."""
    aval = jax.typeof(x)
    kinds = getattr(aval, "manual_axis_type", None)
    return kinds.varying if kinds is not None else getattr(aval, "vma", None)


def _to_varying(x, axis):
    """x typed as varying over `axis` (the values stay: each device's own)."""
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, axis, to="varying")
    return jax.lax.pvary(x, axis)


def _sequence_kind(m, sizes, bounds):
    """A piece of packed halves on traced chunk distances: (switch index, each sequence's bounds as
    float32 (low, high)) (_context_parallel.sequence_band)."""
    low, high, hidden, full = _cp.sequence_band(m, sizes, bounds)
    kind = jnp.where(m == 0, _cp.DIAGONAL, jnp.where(jnp.all(hidden), _cp.HIDDEN,
                                                     jnp.where(jnp.all(full), _cp.FULL, _cp.SEQUENCE_BAND)))
    return kind.astype(jnp.int32), (low.astype(jnp.float32), high.astype(jnp.float32))


class _Plan:
    """Static settings of one call, and a block's pieces run through the block kernels. Each chunk
    of queries against each chunk of keys (_context_parallel.window_pairs) is one piece, whose kind
    (hidden, the diagonal, full, a band: _context_parallel.window_piece) only the devices' indices
    decide: a traced index of a lax.switch over the kinds, with the piece's arrays as operands and
    its result merged outside. Causal attention is the window (-1, 0); without a mask every block is
    one full piece. (A switch over a block's three kinds, whole arrays in and the merges inside its
    branches, crashed XLA 0.11.2's SPMD partitioner; the pieces' switches compile.)"""

    def __init__(self, axis_name, causal, balanced, scale, window=None, longest=0):
        self.axis, self.balanced, self.blocks = axis_name, balanced, _Blocks(scale)
        self.bounds = window if window is not None else ((-1, 0) if causal else None)
        self.longest = longest  # packed parts (thd): the longest chunk of a sequence, else 0
        # Packed parts under a window: the pieces past the diagonal run each sequence's band. (Plain
        # causal needs none: there every sequence's pair is the same kind, as in the dense case.)
        self.sequence_bands = bool(longest) and window is not None
        # The tokens' axis of q, k, v, O and of the statistics.
        self.tokens, self.stats_tokens = (0, 0) if longest else (1, 2)
        self.key = (axis_name, causal, balanced, scale, window, longest)

    # Hashable by its settings: custom_vjp compares its static arguments.
    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _Plan) and self.key == other.key

    def _pieces(self, rank, source, length, offsets=None):
        """(query part, key part, kind, band offset) of each chunk pair; kind and offset traced,
        but a static FULL without a mask. Packed halves under a window (`offsets`: the halves'
        sequence offsets; plain causal is the dense case's): the offset is each sequence's bounds
        (low, high), the kind the window itself (m = 0), HIDDEN or FULL where the window misses or
        covers every sequence's pair, else SEQUENCE_BAND (_context_parallel.sequence_band)."""
        if self.bounds is None:
            return [(_cp.ALL, _cp.ALL, _cp.FULL, 0)]
        n, chunk = jax.lax.axis_size(self.axis), length // 2 if self.balanced else length
        pieces = []
        for q_part, k_part in _cp.window_pairs(self.balanced):
            m = _cp.chunk_index(rank, q_part, n, self.balanced) - _cp.chunk_index(source, k_part, n, self.balanced)
            if self.sequence_bands:
                pieces.append((q_part, k_part) + _sequence_kind(m, offsets[1:] - offsets[:-1], self.bounds))
            else:
                pieces.append((q_part, k_part) + _window_kind(m, chunk, self.bounds))
        return pieces

    def _branches(self, count, run, empty):
        """One function of (`count` arrays, offset, offsets...) per kind, in their order: `empty` for
        HIDDEN and for the bands the bounds cannot give (a band needs its bound: L >= 1, R >= 1), so
        that no call is made for them; else `run(mask, arrays, offsets)` with the kind's mask (a
        band's offset is the traced operand)."""
        left, right = self.bounds if self.bounds is not None else (-1, -1)
        masks = {_cp.DIAGONAL: lambda offset: (_cp.DIAGONAL, self.bounds), _cp.FULL: lambda offset: (_cp.FULL, 0)}
        if self.sequence_bands:  # packed halves under a window: each sequence's band
            masks[_cp.SEQUENCE_BAND] = lambda offset: (_cp.SEQUENCE_BAND, offset)
        else:
            if left >= 1:
                masks[_cp.BAND_PIECE] = lambda offset: (_cp.BAND_PIECE, offset)
            if right >= 1:
                masks[_cp.BAND_UPPER] = lambda offset: (_cp.BAND_UPPER, offset)

        def branch(kind):
            if kind not in masks:
                return lambda *operands: self._varying(empty(*operands[:count]))
            return lambda *operands: self._varying(run(masks[kind](operands[count]), operands[:count],
                                                       self._packed(*operands[count + 1:])))
        kinds = (_cp.HIDDEN, _cp.DIAGONAL, _cp.FULL, _cp.BAND_PIECE, _cp.BAND_UPPER, _cp.SEQUENCE_BAND)
        return [branch(kind) for kind in kinds]

    def _varying(self, results):
        """`results` typed as varying over the mesh axis, as lax.switch wants every branch's results
        typed alike: the core's FFI calls return theirs without the axis in their type (on the
        H200), while a branch's neutral result, made from q, has it."""
        def varying(x):
            axes = _varying_axes(x)
            return x if axes is None or self.axis in axes else _to_varying(x, self.axis)
        return jax.tree.map(varying, results)

    def _packed(self, offsets=None):
        """The block kernels' last argument: (offsets, longest) for packed halves, else None."""
        return (offsets, self.longest) if self.longest else None

    def _piece(self, kind, offset, branches, arrays, offsets):
        operands = tuple(arrays) + (offset,) + _present(offsets)
        if isinstance(kind, int):
            return branches[kind](*operands)
        return jax.lax.switch(kind, branches, *operands)

    def block_forward(self, q, k, v, rank, source, offsets=None):
        """The block's partial result for all of q's rows (neutral where its pieces leave rows out).
        `offsets`: packed halves' sequence offsets (traced), for packed parts."""
        a, sa = self.tokens, self.stats_tokens
        branches = self._branches(3, lambda mask, arrays, packed: self.blocks.forward(*arrays, mask, packed),
                                  lambda q, k, v: _neutral(q))
        o, lse = _neutral(q)
        for q_part, k_part, kind, offset in self._pieces(rank, source, q.shape[a], offsets):
            arrays = (_part(q, q_part, a), _part(k, k_part, a), _part(v, k_part, a))
            rows = _merge((_part(o, q_part, a), _part(lse, q_part, sa)),
                          self._piece(kind, offset, branches, arrays, offsets))
            o, lse = _put(o, q_part, a, rows[0]), _put(lse, q_part, sa, rows[1])
        return o, lse

    def block_backward(self, q, k, v, o, stats, d_o, rank, source, offsets=None):
        """(dQ of q's rows from this block, dK, dV of the block's keys), float32, with the merged O
        and statistics of q's rows."""
        a = self.tokens
        branches = self._branches(6, lambda mask, arrays, packed: self.blocks.backward(*arrays, mask, packed),
                                  lambda q, k, v, o, stats, d_o: (_zeros_like(q), _zeros_like(k), _zeros_like(v)))
        totals = [_zeros_like(q), _zeros_like(k), _zeros_like(v)]
        for q_part, k_part, kind, offset in self._pieces(rank, source, q.shape[a], offsets):
            arrays = (_part(q, q_part, a), _part(k, k_part, a), _part(v, k_part, a), _part(o, q_part, a),
                      _part(stats, q_part, self.stats_tokens), _part(d_o, q_part, a))
            grads = self._piece(kind, offset, branches, arrays, offsets)
            for i, (grad, part) in enumerate(zip(grads, (q_part, k_part, k_part))):
                totals[i] = _put(totals[i], part, a, grad, add=True)
        return tuple(totals)


def _ring_permutation(n):
    return [(i, (i + 1) % n) for i in range(n)]


def _ring_forward(plan, q, k, v, offsets):
    n, rank = jax.lax.axis_size(plan.axis), jax.lax.axis_index(plan.axis)
    out, kv = _neutral(q), (k, v)
    for t in range(n):  # at step t the keys of device rank - t
        if t < n - 1:  # sent before this step's block runs, so that the transfer can hide behind it
            incoming = jax.lax.ppermute(kv, plan.axis, _ring_permutation(n))
        out = _merge(out, plan.block_forward(q, *kv, rank, (rank - t) % n, offsets))
        if t < n - 1:
            kv = incoming
    return out


def _ring_backward(plan, q, k, v, o, stats, d_o, offsets):
    n, rank = jax.lax.axis_size(plan.axis), jax.lax.axis_index(plan.axis)
    d_q = jnp.zeros(q.shape, jnp.float32)
    kv, d_kv = (k, v), (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    for t in range(n):
        if t < n - 1:
            incoming = jax.lax.ppermute(kv, plan.axis, _ring_permutation(n))
        dq_t, dk_t, dv_t = plan.block_backward(q, *kv, o, stats, d_o, rank, (rank - t) % n, offsets)
        d_q = d_q + dq_t
        # A block's dK, dV sums travel with it; after the last step one more hop brings them home.
        d_kv = jax.lax.ppermute((d_kv[0] + dk_t, d_kv[1] + dv_t), plan.axis, _ring_permutation(n))
        if t < n - 1:
            kv = incoming
    return d_q, d_kv[0], d_kv[1]


def _gathered(plan, x):
    n = jax.lax.axis_size(plan.axis)
    return jnp.split(jax.lax.all_gather(x, plan.axis, axis=plan.tokens, tiled=True), n, axis=plan.tokens)


def _all_gather_forward(plan, q, k, v, offsets):
    n, rank = jax.lax.axis_size(plan.axis), jax.lax.axis_index(plan.axis)
    ks, vs = _gathered(plan, k), _gathered(plan, v)
    out = _neutral(q)
    for source in range(n):
        out = _merge(out, plan.block_forward(q, ks[source], vs[source], rank, source, offsets))
    return out


def _all_gather_backward(plan, q, k, v, o, stats, d_o, offsets):
    n, rank = jax.lax.axis_size(plan.axis), jax.lax.axis_index(plan.axis)
    ks, vs = _gathered(plan, k), _gathered(plan, v)
    d_q, d_ks, d_vs = jnp.zeros(q.shape, jnp.float32), [], []
    for source in range(n):
        dq_s, dk_s, dv_s = plan.block_backward(q, ks[source], vs[source], o, stats, d_o, rank, source, offsets)
        d_q, d_ks, d_vs = d_q + dq_s, d_ks + [dk_s], d_vs + [dv_s]
    scatter = lambda parts: jax.lax.psum_scatter(jnp.concatenate(parts, axis=plan.tokens), plan.axis,
                                                 scatter_dimension=plan.tokens, tiled=True)
    return d_q, scatter(d_ks), scatter(d_vs)


_SCHEMES = {"ring": (_ring_forward, _ring_backward), "all_gather": (_all_gather_forward, _all_gather_backward)}


def _sink_partial(q, sink):
    """A learnable sink's share of every row: no value, the logit sink[h], counted once after the
    blocks so that no block adds it again."""
    o, stats = _neutral(q)
    return o, _rows(jnp.broadcast_to(jnp.asarray(sink, jnp.float32), _rows(stats).shape))


def _forward_all(plan, scheme, q, k, v, sink, offsets):
    out = _SCHEMES[scheme][0](plan, q, k, v, offsets)
    return out if sink is None else _merge(out, _sink_partial(q, sink))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _context_parallel(plan, scheme, q, k, v, sink, offsets):
    o, _ = _forward_all(plan, scheme, q, k, v, sink, offsets)
    return o.astype(q.dtype)


def _context_parallel_fwd(plan, scheme, q, k, v, sink, offsets):
    o, stats = _forward_all(plan, scheme, q, k, v, sink, offsets)
    o = o.astype(q.dtype)
    return o, (q, k, v, o, stats, sink, offsets)


def _context_parallel_bwd(plan, scheme, residuals, d_o):
    q, k, v, o, stats, sink, offsets = residuals
    d_o = d_o.astype(o.dtype)
    d_q, d_k, d_v = _SCHEMES[scheme][1](plan, q, k, v, o, stats, d_o, offsets)
    d_sink = None
    if sink is not None:  # -sum over rows of P_sink * rowsum(dO * O), summed over the devices
        rows = (d_o.astype(jnp.float32) * o.astype(jnp.float32)).sum(-1)  # O's rows: [b, s, h] or [tokens, h]
        local = -(jnp.exp(jnp.asarray(sink, jnp.float32) - _rows(stats)) * rows).reshape(-1, rows.shape[-1]).sum(0)
        d_sink = jax.lax.psum(local, plan.axis).astype(jnp.asarray(sink).dtype)
    d_offsets = None if offsets is None else jnp.zeros(offsets.shape, jax.dtypes.float0)
    return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), d_sink, d_offsets


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
    window = _cp.window_bounds(window, causal)
    causal = causal or (window is not None and window[1] == 0)
    packed = cu_seqlens is not None
    _cp.check_arguments(q.shape, k.shape, causal, load_balanced, scheme, "device", packed)
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else float(scale)
    balanced = bool(causal and load_balanced)
    if not packed:
        return _context_parallel(_Plan(axis_name, bool(causal), balanced, scale, window), scheme, q, k, v, sink,
                                 None)
    n = jax.lax.axis_size(axis_name)
    if int(max_seqlen) < 1:
        raise invalid_argument("max_seqlen", max_seqlen, "the longest sequence's tokens (at least 1) with cu_seqlens")
    chunks = 2 * n if balanced else n
    cu = _offsets(cu_seqlens, n, balanced)
    plan = _Plan(axis_name, bool(causal), balanced, scale, window, longest=-(-int(max_seqlen) // chunks))
    _, half = _cp.packed_sizes(cu, n, balanced)
    if not balanced:
        return _context_parallel(plan, scheme, q, k, v, sink, half)
    tokens = q.shape[0]
    order = _cp.halves_order(cu, n, tokens, jnp.arange(tokens), _Ops)
    halves = lambda x: jnp.take(x, order, axis=0)
    o = _context_parallel(plan, scheme, halves(q), halves(k), halves(v), sink, half)
    return jnp.zeros_like(o).at[order].set(o)
