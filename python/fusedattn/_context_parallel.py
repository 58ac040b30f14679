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
"""

from .errors import invalid_argument

LOCAL, EARLIER, LATER = 0, 1, 2
ALL, FIRST, SECOND = "all", "first", "second"  # which part of the queries or keys a piece takes


def kind_of(rank, source):
    """The kind of device `source`'s keys for device `rank`'s queries (plain integers)."""
    return LOCAL if source == rank else EARLIER if source < rank else LATER


def pieces(kind, causal, balanced):
    """The (queries, keys, causal) pieces a block of `kind` runs; empty: the block is hidden."""
    if not causal:
        return [(ALL, ALL, False)]
    if not balanced:
        return {LOCAL: [(ALL, ALL, True)], EARLIER: [(ALL, ALL, False)], LATER: []}[kind]
    return {LOCAL: [(FIRST, FIRST, True), (SECOND, FIRST, False), (SECOND, SECOND, True)],
            EARLIER: [(ALL, FIRST, False)],
            LATER: [(SECOND, ALL, False)]}[kind]


def span(part, length):
    """The [start, stop) of `part` in a sequence axis of `length`."""
    return {ALL: (0, length), FIRST: (0, length // 2), SECOND: (length // 2, length)}[part]


def load_balanced_order(n):
    """Chunk indices, in the order the devices hold them: device r's parts are chunks r and 2n-1-r."""
    return [c for r in range(n) for c in (r, 2 * n - 1 - r)]


def check_arguments(q_shape, k_shape, causal, load_balanced, scheme, holder):
    """What both adapters refuse, in the same words; `holder` names a device or a rank."""
    if scheme not in ("ring", "all_gather"):
        raise invalid_argument("scheme", scheme, '"ring" or "all_gather"')
    if causal and load_balanced and (q_shape[1] % 2 or k_shape[1] % 2):
        raise invalid_argument("q.shape", tuple(q_shape),
                               f"an even number of tokens a {holder} with load_balanced causal attention (two chunks)")
    if causal and q_shape[1] != k_shape[1]:
        raise invalid_argument("k.shape", tuple(k_shape), f"as many tokens a {holder} as q ({q_shape[1]}) when causal")
