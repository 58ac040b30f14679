"""The cover of a mask's tiles by rectangles, each one cuDNN call over views of q, k, v (the pieces
of fusedattn/_tile_schedule.py, which says what the tiles and pieces are and chooses between
schedules): bands first, the band that takes the most PARTIAL tiles at a time, then rectangles of
the FULL tiles left, then rectangles of the PARTIAL ones left (conditions). Pure and framework-free."""
import dataclasses
import functools
from collections import Counter
from typing import Optional, Tuple

EMPTY, FULL, PARTIAL = 0, 1, 2
FULL_PIECE, BAND_PIECE, CONDITIONS_PIECE = "full", "band", "conditions"


@dataclasses.dataclass(frozen=True)
class Tiles:
    """A mask's tiles: `rows` and `cols` the grid's edges (0 first, the lengths last), kinds[i][j]
    EMPTY, FULL or PARTIAL, and bands[i][j] the (lo, hi) of a PARTIAL tile whose kept pairs are
    lo <= j - i <= hi, clipped to the tile's own range of j - i (tile_band), else None."""
    rows: Tuple[int, ...]
    cols: Tuple[int, ...]
    kinds: Tuple[Tuple[int, ...], ...]
    bands: Tuple[Tuple[Optional[Tuple[int, int]], ...], ...]

    def __hash__(self):
        # Hashed once: the schedule's cache looks one up on every call, and a grid of 64 x 64 tiles
        # is thousands of entries to walk.
        try:
            return self.__dict__["_hash"]
        except KeyError:
            value = hash((self.rows, self.cols, self.kinds, self.bands))
            object.__setattr__(self, "_hash", value)
            return value


def reach(r0, r1, c0, c1):
    """The smallest and largest j - i over rows [r0, r1) and keys [c0, c1)."""
    return c0 - (r1 - 1), (c1 - 1) - r0


def tile_band(r0, r1, c0, c1, lo, hi):
    """(kind, band) of the tile under the band lo <= j - i <= hi (None: an open side): EMPTY, FULL,
    or PARTIAL with the band clipped to the tile's reach (the form Tiles.bands holds)."""
    low, high = reach(r0, r1, c0, c1)
    lo, hi = max(low, low if lo is None else lo), min(high, high if hi is None else hi)
    if lo > hi:
        return EMPTY, None
    return (FULL, None) if (lo, hi) == (low, high) else (PARTIAL, (lo, hi))


@functools.lru_cache(maxsize=64)  # flex_attention asks for the same tiles at every call of a loop
def prefix_tiles(length, s_q, s_kv):
    """The tiles of prefix-LM (the first `length` keys seen by every row, the rest causal: j <= i or
    j < length) on the grid its own cut makes: the prefix's rows and keys, then the others."""
    rows = tuple(sorted({0, min(length, s_q), s_q}))
    cols = tuple(sorted({0, min(length, s_kv), s_kv}))
    kinds, bands = [], []
    for r0, r1 in zip(rows, rows[1:]):
        row = [(FULL, None) if c1 <= length else tile_band(r0, r1, c0, c1, None, 0) for c0, c1 in zip(cols, cols[1:])]
        kinds.append(tuple(kind for kind, _ in row))
        bands.append(tuple(band for _, band in row))
    return Tiles(rows, cols, tuple(kinds), tuple(bands))


def window_of(rows, keys, band):
    """(rows, keys, window, align): the view, trimmed of rows or keys that see nothing of the band,
    and the window with which cuDNN's band mask keeps exactly lo <= j - i <= hi there; None where
    none can. The view's diagonal (its top-left corner's j - i, or its bottom-right one's) must lie
    inside the band: a band above it drops the first rows (they see no key of it), one left of it
    the first keys (no row sees them), and likewise the last rows and keys bottom-right. cuDNN wants
    every row to see a key (a left bound: no more rows than keys; bottom-right: no more rows than
    keys + right). Preferred: a right bound of 0 (causal, which cuDNN runs fastest), top-left."""
    lo, hi = band
    options = []
    for align in ("top_left", "bottom_right"):
        (r0, r1), (c0, c1) = rows, keys
        if align == "top_left":
            r0 = max(r0, c0 - hi) if hi is not None else r0
            c0 = max(c0, r0 + lo) if lo is not None else c0
            diagonal = c0 - r0
        else:
            r1 = min(r1, c1 - lo) if lo is not None else r1
            c1 = min(c1, r1 + hi) if hi is not None else c1
            diagonal = c1 - r1
        if r0 >= r1 or c0 >= c1 or (lo is not None and diagonal < lo) or (hi is not None and diagonal > hi):
            continue
        left = -1 if lo is None else diagonal - lo + 1
        right = -1 if hi is None else hi - diagonal
        if (left >= 0 and r1 - r0 > c1 - c0) or (align == "bottom_right" and r1 - r0 > c1 - c0 + max(right, 0)):
            continue
        options.append(((right != 0, align != "top_left"), ((r0, r1), (c0, c1), (left, right), align)))
    return min(options)[1] if options else None


def _runs(flags):
    """The [start, stop) runs of True in a list."""
    out, start = [], None
    for j, flag in enumerate(list(flags) + [False]):
        if flag and start is None:
            start = j
        elif not flag and start is not None:
            out.append((start, j))
            start = None
    return out


class _Grid:
    """The tiles being assigned to pieces: which are still free, and the tiles' reaches."""

    def __init__(self, tiles):
        self.tiles = tiles
        self.n_rows, self.n_cols = len(tiles.rows) - 1, len(tiles.cols) - 1
        self.free = [[kind != EMPTY for kind in row] for row in tiles.kinds]

    def span(self, i0, i1, j0, j1):
        """Rows and keys of the tile rectangle [i0, i1) x [j0, j1)."""
        t = self.tiles
        return (t.rows[i0], t.rows[i1]), (t.cols[j0], t.cols[j1])

    def reach(self, i, j):
        t = self.tiles
        return reach(t.rows[i], t.rows[i + 1], t.cols[j], t.cols[j + 1])

    def touches(self, i, j, band):
        low, high = self.reach(i, j)
        return not ((band[0] is not None and band[0] > high) or (band[1] is not None and band[1] < low))

    def fits(self, i, j, band, owners=None, owner=None):
        """Whether tile (i, j) is free (or, within one band's grouping, `owner`'s) and is exactly
        what `band` keeps of it."""
        kind = self.tiles.kinds[i][j]
        if not self.free[i][j] or kind == EMPTY or (owners is not None and owners[i][j] not in (None, owner)):
            return False
        r0, r1, c0, c1 = self.tiles.rows[i], self.tiles.rows[i + 1], self.tiles.cols[j], self.tiles.cols[j + 1]
        return tile_band(r0, r1, c0, c1, *band) == (kind, self.tiles.bands[i][j])

    def claim(self, i0, i1, j0, j1, band=None):
        for i in range(i0, i1):
            for j in range(j0, j1):
                if band is None or self.touches(i, j, band):
                    self.free[i][j] = False


def _band_groups(grid, band):
    """Rectangles over which `band` runs as cuDNN's band: in each row of tiles, runs of tiles that
    fit it (with at least one PARTIAL among them; FULL tiles alone are full pieces' work), stacked
    onto the one group above that overlaps them while every tile the band touches in the union of
    their keys fits and is no other group's. Each with its view and window (window_of); a group no
    window places is left out."""
    groups, owners = [], [[None] * grid.n_cols for _ in range(grid.n_rows)]

    def fit(g, rows, cols):
        return all(grid.fits(i, j, band, owners, g) for i in rows for j in cols if grid.touches(i, j, band))

    for i in range(grid.n_rows):
        fits = [grid.touches(i, j, band) and grid.fits(i, j, band, owners) for j in range(grid.n_cols)]
        for j0, j1 in _runs(fits):
            if all(grid.tiles.kinds[i][j] != PARTIAL for j in range(j0, j1)):
                continue
            above = [g for g, (_, end, k0, k1) in enumerate(groups) if end == i and k0 < j1 and j0 < k1]
            g = above[0] if len(above) == 1 else None
            if g is not None:
                i0, _, k0, k1 = groups[g]
                u0, u1 = min(k0, j0), max(k1, j1)  # only the new row and the new keys need a look
                if fit(g, [i], range(u0, u1)) and fit(g, range(i0, i), list(range(u0, k0)) + list(range(k1, u1))):
                    groups[g] = [i0, i + 1, u0, u1]
                else:
                    g = None
            if g is None:
                g = len(groups)
                groups.append([i, i + 1, j0, j1])
            i0, _, k0, k1 = groups[g]
            for r in range(i0, i + 1):
                for j in range(k0, k1):
                    if owners[r][j] is None and grid.touches(r, j, band):
                        owners[r][j] = g
    placed = [((i0, i1, j0, j1), window_of(*grid.span(i0, i1, j0, j1), band)) for i0, i1, j0, j1 in groups]
    return [(group, view) for group, view in placed if view is not None]


def _candidate_bands(grid):
    """The bands the PARTIAL tiles suggest: their bounds that cut them (at most two of each side,
    the most common first), each side also open."""
    lows, highs = Counter(), Counter()
    for i in range(grid.n_rows):
        for j in range(grid.n_cols):
            band = grid.tiles.bands[i][j]
            if band is not None and grid.free[i][j]:
                low, high = grid.reach(i, j)
                if band[0] > low:
                    lows[band[0]] += 1
                if band[1] < high:
                    highs[band[1]] += 1
    candidates = [(lo, hi) for lo in [x for x, _ in lows.most_common(2)] + [None]
                  for hi in [x for x, _ in highs.most_common(2)] + [None]]
    return [band for band in candidates if band != (None, None)]


def _rectangles(grid, kind):
    """Free tiles of `kind` as rectangles: each row's runs, a run stacked onto the same run of the
    row above."""
    open_, out = {}, []
    for i in range(grid.n_rows + 1):
        runs = _runs(grid.free[i][j] and grid.tiles.kinds[i][j] == kind for j in range(grid.n_cols)) \
            if i < grid.n_rows else []
        still = {}
        for run in runs:
            still[run] = open_.pop(run, i)
        out.extend((start, i, j0, j1) for (j0, j1), start in open_.items())
        open_ = still
    return out




def cover(tiles):
    """The rectangles covering `tiles`' kept pairs exactly once: (rows, keys, mask, window, align)
    each, mask FULL_PIECE, BAND_PIECE (with its window and alignment) or CONDITIONS_PIECE."""
    grid, out = _Grid(tiles), []
    while True:  # the band that takes the most PARTIAL tiles, until none takes one
        best = None
        for band in _candidate_bands(grid):
            groups = _band_groups(grid, band)
            taken = sum(1 for (i0, i1, j0, j1), _ in groups for i in range(i0, i1) for j in range(j0, j1)
                        if tiles.kinds[i][j] == PARTIAL and grid.touches(i, j, band))
            if taken and (best is None or (taken, -len(groups)) > best[0]):
                best = ((taken, -len(groups)), band, groups)
        if best is None:
            break
        for (i0, i1, j0, j1), (rows, keys, window, align) in best[2]:
            grid.claim(i0, i1, j0, j1, best[1])
            out.append((rows, keys, BAND_PIECE, window, align))
    for kind, mask in ((FULL, FULL_PIECE), (PARTIAL, CONDITIONS_PIECE)):
        for i0, i1, j0, j1 in _rectangles(grid, kind):
            grid.claim(i0, i1, j0, j1)
            out.append(grid.span(i0, i1, j0, j1) + (mask, (-1, -1), "top_left"))
    return out
