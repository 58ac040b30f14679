"""How one device runs one block of keys in context parallelism: each chunk of its queries against
each chunk of the block's keys is a piece, whose kind (hidden, the diagonal, full, a band) only the
devices' traced indices decide, so each piece is a lax.switch over the kinds' block calls, its
result merged outside."""
import jax
import jax.numpy as jnp

from .. import _context_parallel as _cp
from ._context_parallel_blocks import BlockKernels, merge, neutral, part_of, put, zeros_like


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


class BlockSchedule:
    """Static settings of one call, and a block's pieces run through the block kernels. Each chunk
    of queries against each chunk of keys (_context_parallel.window_pairs) is one piece, whose kind
    (hidden, the diagonal, full, a band: _context_parallel.window_piece) only the devices' indices
    decide: a traced index of a lax.switch over the kinds, with the piece's arrays as operands and
    its result merged outside. Causal attention is the window (-1, 0); without a mask every block is
    one full piece. (A switch over a block's three kinds, whole arrays in and the merges inside its
    branches, crashed XLA 0.11.2's SPMD partitioner; the pieces' switches compile.)"""

    def __init__(self, *, axis_name, causal, balanced, scale, window=None, longest=0):
        self.axis, self.balanced, self.blocks = axis_name, balanced, BlockKernels(scale)
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
        return isinstance(other, BlockSchedule) and self.key == other.key

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
        for q_part, k_part in _cp.window_pairs(balanced=self.balanced):
            m = (_cp.chunk_index(rank, q_part, n, balanced=self.balanced)
                 - _cp.chunk_index(source, k_part, n, balanced=self.balanced))
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
        operands = tuple(arrays) + (offset,) + (() if offsets is None else (offsets,))
        if isinstance(kind, int):
            return branches[kind](*operands)
        return jax.lax.switch(kind, branches, *operands)

    def block_forward(self, q, k, v, *, rank, source, offsets=None):
        """The block's partial result for all of q's rows (neutral where its pieces leave rows out).
        `offsets`: packed halves' sequence offsets (traced), for packed parts."""
        a, sa = self.tokens, self.stats_tokens
        run = lambda mask, arrays, packed: self.blocks.forward(*arrays, mask=mask, packed=packed)
        branches = self._branches(3, run, lambda q, k, v: neutral(q))
        o, lse = neutral(q)
        for q_part, k_part, kind, offset in self._pieces(rank, source, q.shape[a], offsets):
            arrays = (part_of(q, q_part, a), part_of(k, k_part, a), part_of(v, k_part, a))
            rows = merge((part_of(o, q_part, a), part_of(lse, q_part, sa)),
                         self._piece(kind, offset, branches, arrays, offsets))
            o, lse = put(o, q_part, a, rows[0]), put(lse, q_part, sa, rows[1])
        return o, lse

    def block_backward(self, q, k, v, o, stats, d_o, *, rank, source, offsets=None):
        """(dQ of q's rows from this block, dK, dV of the block's keys), float32, with the merged O
        and statistics of q's rows."""
        a = self.tokens
        run = lambda mask, arrays, packed: self.blocks.backward(*arrays, mask=mask, packed=packed)
        branches = self._branches(6, run, lambda q, k, v, o, stats, d_o: (zeros_like(q), zeros_like(k), zeros_like(v)))
        totals = [zeros_like(q), zeros_like(k), zeros_like(v)]
        for q_part, k_part, kind, offset in self._pieces(rank, source, q.shape[a], offsets):
            arrays = (part_of(q, q_part, a), part_of(k, k_part, a), part_of(v, k_part, a), part_of(o, q_part, a),
                      part_of(stats, q_part, self.stats_tokens), part_of(d_o, q_part, a))
            grads = self._piece(kind, offset, branches, arrays, offsets)
            for i, (grad, part) in enumerate(zip(grads, (q_part, k_part, k_part))):
                totals[i] = put(totals[i], part, a, grad, add=True)
        return tuple(totals)
