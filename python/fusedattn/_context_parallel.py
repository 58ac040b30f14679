"""Context parallelism's framework-free part, shared by fusedattn.torch and fusedattn.jax: which
pieces of attention one device runs against one block of keys.

Each device holds its part of the sequence: with causal load balancing, chunks r and 2N-1-r of 2N
(its two halves), otherwise chunk r. The keys of device s are, for device r's queries, LOCAL
(s = r), EARLIER (s < r) or LATER (s > r), and each kind runs a fixed list of pieces: a part of
the queries (all, or one half) against a part of the block's keys, masked causally from the
top-left (a diagonal piece: a chunk against itself) or not at all. With load balancing every kind
is the same work, 2c x c key pairs for chunks of c tokens:
  LOCAL:   first half against first half (diagonal), second against first (full), second against
           second (diagonal); r's second chunk, 2N-1-r, comes after its first.
  EARLIER: both halves against s's first half, chunk s < r (full); s's second chunk, 2N-1-s > 2N-1-r,
           is hidden from both.
  LATER:   the second half, chunk 2N-1-r, against both of s's chunks (full); r's first chunk sees
           neither.
Contiguous chunks: LOCAL is one diagonal piece, EARLIER one full piece, LATER nothing. Without a
causal mask every block is one full piece.

A sliding window (L, R) is the core's (spec/window_rule.h): key j visible to query i where
i - L < j <= i + R, in positions of the whole sequence (L keys up to the diagonal, R after it; -1:
no bound; causal: R = 0). It cuts across chunks: each chunk of queries against each chunk of keys,
m chunks earlier (of c tokens; m < 0: later), is one window piece (window_piece). In local
positions the window is m c - L + 1 <= j - i <= m c + R, and j - i runs over [-(c - 1), c - 1], so
the piece is hidden (the window misses the chunk: m c - L + 1 >= c, or m c + R <= -c), the
diagonal one (m = 0: the window within the chunk, cuDNN's own), full (the window covers it) or a
band with one bound inside it: j - i >= m c - L + 1 (keys earlier, m > 0: kind BAND_PIECE) or
j - i <= m c + R (keys later, m < 0: kind BAND_UPPER). cuDNN runs a band as the score modifier BAND
or BAND_BELOW with the offset as its runtime scalar, so every offset shares one plan. (For m != 0
one bound at most falls inside: the other is at least c away.)

Over packed sequences every sequence has chunks of its own length c_b, so one piece (a ragged call
over every sequence) meets a different kind in each: each chunk pair m != 0 runs as the score
modifier BANDS_PER_SEQUENCE, whose tensors hold each sequence's bounds m c_b - L + 1 <= j - i <=
m c_b + R (sequence_band), unless the window misses every sequence's pair (no call) or covers every
one (a plain call); m = 0 is the window itself in every sequence.
"""

from typing import NamedTuple, Optional, Tuple

from . import _core as core
from .errors import invalid_argument

LOCAL, EARLIER, LATER = 0, 1, 2
ALL, FIRST, SECOND = "all", "first", "second"  # which part of the queries or keys a piece takes
# A piece's mask: (FULL, 0), (DIAGONAL, (L, R)) (from the top-left: (-1, 0) causal, else a
# window's bounds), (BAND_PIECE, offset), (BAND_UPPER, offset); the kinds are the indices JAX
# switches on, HIDDEN a piece not run.
HIDDEN, DIAGONAL, FULL, BAND_PIECE, BAND_UPPER = 0, 1, 2, 3, 4
# Packed sequences: (SEQUENCE_BAND, (low, high)), each sequence's bounds of j - i (sequence_band).
SEQUENCE_BAND = 5
BAND = "select(ge(sub(kv,q),$0),score,-inf)"  # key j visible to query i where j - i >= $0 (local indices)
BAND_BELOW = "select(le(sub(kv,q),$0),score,-inf)"  # key j visible to query i where j - i <= $0
# Key j visible to query i of sequence b where t0[b] <= j - i <= t1[b] (local indices).
BANDS_PER_SEQUENCE = "select(and(ge(sub(kv,q),t0[b]),le(sub(kv,q),t1[b])),score,-inf)"
# A bound a side without one takes: past any j - i, and a float32 integer exactly (a power of two).
UNBOUNDED = 2 ** 30


def kind_of(rank, source):
    """The kind of device `source`'s keys for device `rank`'s queries (plain integers)."""
    return LOCAL if source == rank else EARLIER if source < rank else LATER


def pieces(kind, *, causal, balanced):
    """The (queries, keys, mask) pieces a block of `kind` runs; empty: the block is hidden. A mask
    is (FULL, 0) or (DIAGONAL, (-1, 0)): causal from the top-left (under a window, the window's
    diagonal and bands too: window_pieces)."""
    full, diagonal = (FULL, 0), (DIAGONAL, (-1, 0))
    if not causal:
        return [(ALL, ALL, full)]
    if not balanced:
        return {LOCAL: [(ALL, ALL, diagonal)], EARLIER: [(ALL, ALL, full)], LATER: []}[kind]
    return {LOCAL: [(FIRST, FIRST, diagonal), (SECOND, FIRST, full), (SECOND, SECOND, diagonal)],
            EARLIER: [(ALL, FIRST, full)],
            LATER: [(SECOND, ALL, full)]}[kind]


def window_pieces(rank, source, n, *, balanced, length, bounds):
    """The (queries, keys, mask) pieces of device `source`'s keys for device `rank`'s queries (plain
    integers) under a sliding window of `bounds` (L, R); `length`: tokens a device holds."""
    chunk = length // 2 if balanced else length
    out = []
    for q_part, k_part in window_pairs(balanced):
        m = (chunk_index(rank, q_part, n, balanced=balanced)
             - chunk_index(source, k_part, n, balanced=balanced))
        kind, offset = window_piece(m, chunk, bounds)
        if kind != HIDDEN:
            out.append((q_part, k_part, (kind, {DIAGONAL: tuple(bounds), FULL: 0}.get(kind, offset))))
    return out


def span(part, length):
    """The [start, stop) of `part` in a sequence axis of `length`."""
    return {ALL: (0, length), FIRST: (0, length // 2), SECOND: (length // 2, length)}[part]


def load_balanced_order(n):
    """Chunk indices, in the order the devices hold them: device r's parts are chunks r and 2n-1-r."""
    return [c for r in range(n) for c in (r, 2 * n - 1 - r)]


def in_sequence_order(parts, n):
    """The 2n chunks that load balancing put in the devices' order (load_balanced_order), back in
    the sequence's order."""
    order = [None] * (2 * n)
    for position, chunk in enumerate(load_balanced_order(n)):
        order[chunk] = parts[position]
    return order


class CallOptions(NamedTuple):
    """A context-parallel call's options as both adapters run them: the window's bounds (None for
    none), whether the diagonal is causal, whether the chunks are load-balanced, the scale."""
    window: Optional[Tuple[int, int]]
    causal: bool
    balanced: bool
    scale: float


def call_options(q_shape, k_shape, *, window, causal, load_balanced, scheme, holder, packed, scale):
    """The options of a call with these arguments, after refusing what both adapters refuse in the
    same words (`holder` names a device or a rank); the scale defaults to 1/sqrt(d)."""
    bounds = window_bounds(window, causal)
    causal = bool(causal or (bounds is not None and bounds[1] == 0))
    _check_arguments(q_shape, k_shape, causal=causal, load_balanced=load_balanced, scheme=scheme, holder=holder,
                     packed=packed)
    return CallOptions(window=bounds, causal=causal, balanced=bool(causal and load_balanced),
                       scale=1.0 / q_shape[-1] ** 0.5 if scale is None else float(scale))


def _check_arguments(q_shape, k_shape, *, causal, load_balanced, scheme, holder, packed):
    """`packed`: thd parts ([tokens, h, d]), whose offsets check_packed_offsets checks."""
    if scheme not in ("ring", "all_gather"):
        raise invalid_argument("scheme", scheme, '"ring" or "all_gather"')
    axis = 0 if packed else 1
    if causal and load_balanced and not packed and (q_shape[axis] % 2 or k_shape[axis] % 2):
        raise invalid_argument("q.shape", tuple(q_shape),
                               f"an even number of tokens a {holder} with load_balanced causal attention (two chunks)")
    if (causal or packed) and q_shape[axis] != k_shape[axis]:
        when = "packed" if packed else "causal"
        raise invalid_argument("k.shape", tuple(k_shape),
                               f"as many tokens a {holder} as q ({q_shape[axis]}) when {when}")


# --- packed sequences (thd) ---------------------------------------------------------------------------
#
# A packed batch is split sequence by sequence: each sequence's tokens are cut into 2N chunks (N
# without load balancing) and device r holds chunks r and 2N-1-r (chunk r) of every sequence, one
# sequence after the other, so its part is a packed batch of its own with offsets cu_seqlens / N.
# Inside a call a device orders its tokens as all sequences' first chunks, then all second ones:
# each half is then a packed batch with offsets cu_seqlens / 2N, and the pieces of a block are
# the dense case's (a half against a half) as ragged calls, each sequence against itself alone.

def check_packed_offsets(shape, offsets, n, *, balanced, holder):
    """The chunks every sequence is cut into (2n, or n), after checking the whole batch's
    cu_seqlens as both adapters refuse it: int32 [b + 1] cumulative offsets from 0, each sequence's
    length a multiple of the chunks. `offsets`: its values as plain integers, or None where they
    are traced (then only its shape is checked); `holder` names a device or a rank."""
    if len(shape) != 1 or shape[0] < 2 or (offsets is not None and offsets[0] != 0):
        raise invalid_argument("cu_seqlens", tuple(shape), "int32 [b + 1] cumulative offsets from 0")
    chunks = 2 * n if balanced else n
    lengths = [] if offsets is None else [b - a for a, b in zip(offsets, offsets[1:])]
    bad = [(i, length) for i, length in enumerate(lengths) if length < 0 or length % chunks]
    if bad:
        i, length = bad[0]
        each = f"chunks r and {2 * n - 1}-r of {chunks}" if balanced else f"chunk r of {chunks}"
        raise invalid_argument("cu_seqlens", f"sequence {i} of length {length} ({len(bad)} such)",
                               f"sequence lengths that are multiples of {chunks}: {holder} r holds {each} of each")
    return chunks


def packed_sizes(cu, n, *, balanced):
    """(chunk lengths [b], offsets of one part's half (of the whole part, unbalanced) [b + 1]) of a
    packed batch with offsets `cu` (int arrays of a framework: the arithmetic is the same)."""
    size = (cu[1:] - cu[:-1]) // (2 * n if balanced else n)
    return size, cu // (2 * n if balanced else n)


def packed_order(cu, n, *, balanced, tokens, positions, ops):
    """The whole batch's token that each of `positions` of the ranks' parts laid end to end
    (load_balance's order: part r holds chunks r and 2n-1-r, or r, of every sequence in turn)
    holds. `cu`: the batch's offsets; `tokens`: its count; `ops.searchsorted(a, v)`: the index of
    the first element of a greater than v."""
    size, _ = packed_sizes(cu, n, balanced=balanced)
    part = tokens // n
    rank, within_part = positions // part, positions % part
    local = cu // n  # where each sequence's chunks start in a part
    seq = ops.searchsorted(local[1:], within_part)
    within = within_part - local[seq]
    if not balanced:
        return cu[seq] + rank * size[seq] + within
    second = within >= size[seq]
    chunk = ops.where(second, 2 * n - 1 - rank, rank)
    return cu[seq] + chunk * size[seq] + within - ops.where(second, size[seq], 0)


def halves_order(cu, n, tokens, positions, ops):
    """The token of a load-balanced part (`tokens` long) that each of `positions` of its halves
    order holds: every sequence's first chunk, then every sequence's second."""
    size, half = packed_sizes(cu, n, balanced=True)
    second = positions >= tokens // 2
    within_half = positions - ops.where(second, tokens // 2, 0)
    seq = ops.searchsorted(half[1:], within_half)
    return cu[seq] // n + within_half - half[seq] + ops.where(second, size[seq], 0)


def packed_pieces(pieces):
    """`pieces` for packed halves: a piece of all of a part's tokens (ALL) is two, one per half, as
    a sequence's tokens of the two halves lie apart (only full pieces take ALL)."""
    halves = lambda part: (FIRST, SECOND) if part == ALL else (part,)
    return [(q_part, k_part, mask) for q, k, mask in pieces for q_part in halves(q) for k_part in halves(k)]


def sequence_band(m, sizes, bounds):
    """A piece of packed halves whose queries are `m` chunks after its keys (m != 0), under a window
    of `bounds` (L, R): each sequence's bounds of j - i in local positions, m c_b - L + 1 and
    m c_b + R (UNBOUNDED past a side without one), and whether the window misses each sequence's
    chunk pair (hidden) or covers it (full); an empty sequence is both. `sizes`: each sequence's
    chunk length c_b, an integer array of a framework (the arithmetic is the same); returns
    (low, high, hidden, full), arrays of it."""
    left, right = bounds
    low = m * sizes - left + 1 if left >= 0 else sizes * 0 - UNBOUNDED
    high = m * sizes + right if right >= 0 else sizes * 0 + UNBOUNDED
    empty = sizes == 0
    hidden = (low >= sizes) | (high <= -sizes) | empty
    full = (low <= 1 - sizes) & (high >= sizes - 1) | empty
    return low, high, hidden, full


# --- sliding windows -------------------------------------------------------------------------------

def window_bounds(window, causal):
    """A window's bounds (L, R) under context parallelism, or None for none (plain causal included,
    which runs as pieces()): causal sliding (W, 0) (window=(W, 0), or (W, -1) with causal), or with
    causal=False two-sided (L, R), either -1 for no bound. What causal does to a window is the core's
    rule (causal_window, the same words as every adapter's); then InvalidArgument for a bound that is
    not one."""
    left, right = (int(x) for x in window)
    if left == -1 and right == -1:
        return None
    if causal:
        left, right = core.causal_window((left, right))
    if left == 0 or left < -1 or right < -1:
        raise invalid_argument("window", f"{left},{right}", "bounds of -1 (none) or at least 1 key on the left")
    return left, right


def mask_options(mask):
    """(causal, window, score_mod) of the block call that runs a piece under `mask`: the diagonal
    from the top-left (causal with a causal window's left bound W >= 1: window=(W, 0); a two-sided
    window's bounds as they are), the bands as the modifiers BAND and BAND_BELOW (the offset the
    call's scalar, never looked at here: JAX traces it), and packed sequences' bands as
    BANDS_PER_SEQUENCE (each sequence's bounds its two tensors)."""
    kind, value = mask
    if kind == SEQUENCE_BAND:
        return False, (-1, -1), BANDS_PER_SEQUENCE
    if kind == DIAGONAL:
        left, right = value
        if right == 0:
            return True, (left, 0) if left >= 1 else (-1, -1), ""
        return False, (left, right), ""
    return False, (-1, -1), {BAND_PIECE: BAND, BAND_UPPER: BAND_BELOW}.get(kind, "")


def window_pairs(balanced):
    """The (query part, key part) pairs of a block under a window: each chunk against each chunk."""
    return [(FIRST, FIRST), (FIRST, SECOND), (SECOND, FIRST), (SECOND, SECOND)] if balanced else [(ALL, ALL)]


def chunk_index(device, part, n, *, balanced):
    """The chunk of the whole sequence that `part` of `device`'s tokens is (in chunks of the part's
    length): load-balanced, chunks device and 2n-1-device of 2n; else chunk device of n. Plain
    integers, or arrays of a framework (the arithmetic is the same)."""
    if not balanced:
        return device
    return device if part == FIRST else 2 * n - 1 - device


def window_piece(m, chunk, bounds):
    """(kind, offset) of queries `m` chunks of `chunk` tokens after their keys (m < 0: before) under
    a window of `bounds` (L, R): the module's docstring's kinds; the offset is the band's bound,
    m*chunk + R for BAND_UPPER (j - i <= offset), else m*chunk - L + 1 (BAND_PIECE: j - i >= offset).
    Plain integers; the JAX version traces the same comparisons."""
    left, right = bounds
    low, high = m * chunk - left + 1, m * chunk + right
    if (left >= 0 and low >= chunk) or (right >= 0 and high <= -chunk):
        return HIDDEN, low
    if m == 0:
        return DIAGONAL, low
    if left >= 0 and low > -(chunk - 1):
        return BAND_PIECE, low
    if right >= 0 and high < chunk - 1:
        return BAND_UPPER, high
    return FULL, low
