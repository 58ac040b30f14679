"""Masks lowered by structure: which cuDNN calls over views of (query rows x keys) compute a mask
exactly, and whether they beat one masked call over the whole square. Pure and framework-free; the
adapters classify the tiles (fusedattn/torch/_flex_tiles.py) and run the pieces.

A mask is seen as tiles of (query block, key block) on a grid (edges of rows and of keys, not
necessarily even): EMPTY (no pair kept), FULL (every pair kept) or PARTIAL (some), and a partial
tile whose kept pairs are exactly lo <= j - i <= hi (j the key, i the query, both in positions of
the whole problem) has that band. A schedule is a list of pieces, each a rectangle of tiles run as
one call over views of q, k, v:
  full        every tile FULL: an unmasked call;
  band        the band's pairs of the rectangle, with cuDNN's band mask (a window, top-left or
              bottom-right, on the view), which skips the tiles the band misses: every tile of the
              rectangle the band touches is FULL inside it or PARTIAL with that band;
  conditions  every tile PARTIAL: the mask as conditions on the scores (the whole rectangle computed).
Every kept pair is in exactly one piece and no piece computes a pair outside the mask, so the
pieces' results merge exactly through the log-sum-exp (fusedattn/_merge.py); rows that no piece
covers see no key (O 0, log-sum-exp -inf, as FlexAttention gives).

The cost model, in microseconds on the H200 (BF16, forward), calibrated on fusedattn's own runs
at 2 x 2k, 16 heads, d 128 (causal 0.12 ms; prefix-LM as conditions over the square 0.59 ms):
  a call costs OVERHEAD_US = 10 (the eager host path and the launch, not hidden at these sizes);
  a 128 x 128 kernel tile costs 4 * 128 * 128 * d * b * h / 3.5e8 (350 TFLOP/s reached): 0.77 us
  at b * h = 32, d = 128 (causal: 136 tiles, 10 + 105 = 115 us: the measured 0.12 ms);
  conditions cost CONDITIONS_FACTOR = 2.5 times the tile (0.59 ms for the square's 256 tiles,
  against 0.2 ms unmasked: the modifier's graph evaluates every score);
  a merge of a piece into rows already written costs MERGE_US = 20 (its dozen elementwise launches)
  plus 64 bytes per element of O over its rows at 3 TB/s (float32 reads and writes, a dozen passes).
Worked numbers (b * h = 32, d = 128: tile 0.77 us):
  prefix-LM of 256 over 2048: one masked call 10 + 256 * 0.77 * 2.5 = 501 us; the schedule
  [rows 0-256 x keys 0-256 full] + [rows 256-2048 x all keys, causal bottom-right] shares no row:
  2 * 10 + (4 + 133) * 0.77 = 125 us, split (4x);
  a 1024-block checkerboard over 8192 (32 full rectangles, 8 row strips of 4 each): one masked
  call 10 + 4096 * 0.77 * 2.5 = 7864 us; the pieces 32 * 10 + 2048 * 0.77 = 1891 us plus 24 merges
  of 1024 rows (20 + 64 * 32 * 1024 * 128 / 3e6 = 109 us each) = 4518 us, split;
  32 scattered PARTIAL tiles of the 64 of 1024 x 1024 at b * h = 8, d = 64 (tile 0.096 us): their
  calls alone cost 32 * 10 = 320 us, merges aside, against 10 + 64 * 0.096 * 2.5 = 25 us for one
  masked call: no split."""
import dataclasses
import functools
import math
from typing import Tuple

from ._tile_cover import BAND_PIECE, CONDITIONS_PIECE, FULL_PIECE, Tiles, cover  # noqa: F401 (the schedule's terms)

OVERHEAD_US = 10.0
FLOPS_PER_US = 3.5e8
CONDITIONS_FACTOR = 2.5
MERGE_US = 20.0
MERGE_BYTES = 64.0
BYTES_PER_US = 3.0e6
KERNEL_TILE = 128  # the kernels' tile of rows and of keys, over which they skip or compute


@dataclasses.dataclass(frozen=True)
class Piece:
    """One call: query rows [rows), keys [keys), and its mask: FULL_PIECE (none), BAND_PIECE (window
    (left, right) placed by align on the view: p - left < j <= p + right, p = i top-left, i + keys
    - rows bottom-right, -1 an open side) or CONDITIONS_PIECE; `merges`: whether rows of it were
    written by a piece before it (its result is then merged into theirs)."""
    rows: Tuple[int, int]
    keys: Tuple[int, int]
    mask: str
    window: Tuple[int, int] = (-1, -1)
    align: str = "top_left"
    merges: bool = False


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The pieces (where `square`, one: the whole square with the mask as conditions, which the cost
    model found cheaper), their modelled cost and the square's (microseconds), whether the pieces
    share no row, and whether some row may see no key inside a piece (conditions can drop a whole
    row, which the adapter then sets to FlexAttention's O 0 and log-sum-exp -inf)."""
    pieces: Tuple[Piece, ...]
    square: bool
    cost_us: float
    square_us: float
    rows_apart: bool
    empty_rows_inside: bool


@dataclasses.dataclass(frozen=True)
class Work:
    """What a tile costs: batch entries times query heads, and the head dimension."""
    heads: int
    head_dim: int

    def tile_us(self):
        return 4.0 * KERNEL_TILE * KERNEL_TILE * self.head_dim * self.heads / FLOPS_PER_US


def kernel_tiles(piece):
    """The kernel tiles a piece computes: its view's 128 x 128 tiles, those its band touches."""
    n_rows, n_keys = piece.rows[1] - piece.rows[0], piece.keys[1] - piece.keys[0]
    if piece.mask != BAND_PIECE:
        return math.ceil(n_rows / KERNEL_TILE) * math.ceil(n_keys / KERNEL_TILE)
    left, right = piece.window
    shift = n_keys - n_rows if piece.align == "bottom_right" else 0
    count = 0
    for start in range(0, n_rows, KERNEL_TILE):
        last = min(start + KERNEL_TILE, n_rows) - 1
        low = 0 if left < 0 else max(0, start + shift - left + 1)
        high = n_keys - 1 if right < 0 else min(n_keys - 1, last + shift + right)
        count += max(0, high // KERNEL_TILE - low // KERNEL_TILE + 1) if high >= low else 0
    return count


@functools.lru_cache(maxsize=256)
def schedule(tiles, work, conditions=True):
    """The Schedule of `tiles` (Tiles) for `work` (Work), kept by both (the block structure and
    the problem's size). conditions=False: the mask cannot run as conditions (no mask_mod beside a
    BlockMask, or one the tracer cannot follow), so neither can the square: None where a PARTIAL
    tile outside every band would need them."""
    pieces = [Piece(rows, keys, mask, window, align) for rows, keys, mask, window, align in cover(tiles)]
    if not conditions and any(piece.mask == CONDITIONS_PIECE for piece in pieces):
        return None
    return _costed(sorted(pieces, key=lambda p: (p.rows, p.keys)), tiles, work, conditions)


def _costed(pieces, tiles, work, conditions):
    """The Schedule: each piece's merge flag and the cost model's verdict against the square."""
    written, placed = [], []
    for piece in pieces:
        merges = any(r0 < piece.rows[1] and piece.rows[0] < r1 for r0, r1 in written)
        written.append(piece.rows)
        placed.append(dataclasses.replace(piece, merges=merges))
    tile_us = work.tile_us()
    cost = sum(OVERHEAD_US + kernel_tiles(p) * tile_us * (CONDITIONS_FACTOR if p.mask == CONDITIONS_PIECE else 1.0)
               + (MERGE_US + MERGE_BYTES * work.heads * work.head_dim * (p.rows[1] - p.rows[0]) / BYTES_PER_US
                  if p.merges else 0.0) for p in placed)
    whole = Piece((0, tiles.rows[-1]), (0, tiles.cols[-1]), CONDITIONS_PIECE)
    square = OVERHEAD_US + kernel_tiles(whole) * tile_us * CONDITIONS_FACTOR
    if conditions and square <= cost:
        return Schedule((whole,), True, cost, square, True, True)
    return Schedule(tuple(placed), False, cost, square, not any(p.merges for p in placed),
                    any(p.mask == CONDITIONS_PIECE for p in placed))
