"""The schedule of masks lowered by structure (fusedattn/_tile_schedule.py, _tile_cover.py), pure: on
masks given pair by pair, every kept pair in exactly one piece and none outside (random block masks
by the hundred, with bands, uneven grids and rows that see nothing), bands found where cuDNN's band
mask places them, and the cost model's decisions with the worked numbers of its docstring."""
import random

import pytest

from fusedattn import _tile_cover as cover
from fusedattn import _tile_schedule as ts

BIG = ts.Work(heads=32, head_dim=128)  # 2 x 16 heads, d 128: a 128 x 128 tile costs 0.77 us


def grid(length, block):
    return tuple(range(0, length, block)) + (length,)


def tiles_of(keep, rows, cols):
    """The Tiles of a mask given as keep(i, j), on the grid of edges `rows` x `cols`, worked out pair
    by pair (as fusedattn.torch's _flex_tiles does with the mask_mod)."""
    kinds, bands = [], []
    for r0, r1 in zip(rows, rows[1:]):
        kind_row, band_row = [], []
        for c0, c1 in zip(cols, cols[1:]):
            kept = {(i, j) for i in range(r0, r1) for j in range(c0, c1) if keep(i, j)}
            kind = cover.EMPTY if not kept else cover.FULL if len(kept) == (r1 - r0) * (c1 - c0) else cover.PARTIAL
            band = None
            if kind == cover.PARTIAL:
                lo, hi = min(j - i for i, j in kept), max(j - i for i, j in kept)
                every = {(i, j) for i in range(r0, r1) for j in range(c0, c1) if lo <= j - i <= hi}
                band = (lo, hi) if every == kept else None
            kind_row.append(kind)
            band_row.append(band)
        kinds.append(tuple(kind_row))
        bands.append(tuple(band_row))
    return cover.Tiles(tuple(rows), tuple(cols), tuple(kinds), tuple(bands))


def pairs(piece, keep):
    """The pairs a piece computes, as fusedattn's call over its view computes them."""
    (r0, r1), (c0, c1) = piece.rows, piece.keys
    left, right = piece.window
    shift = (c1 - c0) - (r1 - r0) if piece.align == "bottom_right" else 0
    out = []
    for i in range(r0, r1):
        for j in range(c0, c1):
            p = i - r0 + shift
            in_band = (left < 0 or j - c0 > p - left) and (right < 0 or j - c0 <= p + right)
            if piece.mask == ts.FULL_PIECE or (piece.mask == ts.BAND_PIECE and in_band) or \
                    (piece.mask == ts.CONDITIONS_PIECE and keep(i, j)):
                out.append((i, j))
    return out


def overlapping(edges, span):
    """The tiles of a grid's `edges` that meet [span)."""
    return [n for n in range(len(edges) - 1) if edges[n] < span[1] and span[0] < edges[n + 1]]


def check_exact(schedule, keep, s_q, s_kv):
    seen = {}
    for piece in schedule.pieces:
        for pair in pairs(piece, keep):
            seen[pair] = seen.get(pair, 0) + 1
    want = {(i, j) for i in range(s_q) for j in range(s_kv) if keep(i, j)}
    assert set(seen) == want, (sorted(set(seen) ^ want)[:5], schedule)
    assert all(count == 1 for count in seen.values()), schedule
    written = []
    for piece in schedule.pieces:  # the merge flag: rows an earlier piece wrote
        assert piece.merges == any(a < piece.rows[1] and piece.rows[0] < b for a, b in written), schedule
        written.append(piece.rows)
    assert schedule.rows_apart == (not any(piece.merges for piece in schedule.pieces))


@pytest.fixture
def no_call_overhead(monkeypatch):
    """Pieces wherever they compute fewer pairs than one masked call: these grids are small (their
    calls and merges free, the kernels' tile one pair)."""
    monkeypatch.setattr(ts, "OVERHEAD_US", 0.0)
    monkeypatch.setattr(ts, "KERNEL_TILE", 1)
    monkeypatch.setattr(ts, "MERGE_BYTES", 0.0)
    monkeypatch.setattr(ts, "MERGE_US", 0.0)
    ts.schedule.cache_clear()
    yield
    ts.schedule.cache_clear()


def random_mask(rng, s_q, s_kv, block):
    """Per block: nothing, everything, a band (one side or two) or scattered pairs."""
    chosen = {}
    for a in range(0, s_q, block):
        for b in range(0, s_kv, block):
            kind = rng.choice(["empty", "full", "band", "band", "scattered"])
            lo, hi = sorted(rng.randint(b - a - block, b - a + block) for _ in "lh")
            chosen[a // block, b // block] = (kind, rng.choice([lo, None]), rng.choice([hi, None]), rng.random())

    def keep(i, j):
        kind, lo, hi, seed = chosen[i // block, j // block]
        if kind == "band":
            return (lo is None or j - i >= lo) and (hi is None or j - i <= hi)
        return kind == "full" or (kind == "scattered" and hash((i, j, seed)) % 3 == 0)
    return keep


@pytest.mark.parametrize("seed", range(300))
def test_random_block_masks_are_covered_exactly_once(no_call_overhead, seed):
    rng = random.Random(seed)
    block = rng.choice([4, 8])
    s_q, s_kv = rng.randint(block, 6 * block), rng.randint(block, 6 * block)
    keep = random_mask(rng, s_q, s_kv, block)
    tiles = tiles_of(keep, grid(s_q, block), grid(s_kv, block))
    schedule = ts.schedule(tiles, BIG)
    if schedule.square:  # only where the pieces compute no fewer tiles than the square
        assert schedule.square_us <= schedule.cost_us and len(schedule.pieces) == 1
    check_exact(schedule, keep, s_q, s_kv)
    for piece in () if schedule.square else schedule.pieces:  # each piece only over tiles of its kind
        rows, cols = overlapping(tiles.rows, piece.rows), overlapping(tiles.cols, piece.keys)
        kinds = {tiles.kinds[a][b] for a in rows for b in cols}
        if piece.mask != ts.BAND_PIECE:
            assert kinds == {cover.FULL if piece.mask == ts.FULL_PIECE else cover.PARTIAL}, (piece, kinds)
    without = ts.schedule(tiles, BIG, conditions=False)  # a mask that cannot be conditions
    assert (without is None) == any(piece.mask == ts.CONDITIONS_PIECE for piece in schedule.pieces)
    assert without is None or not without.square


def views(schedule):
    return [(piece.rows, piece.keys, piece.mask, piece.window, piece.align) for piece in schedule.pieces]


def test_a_causal_or_sliding_mask_is_one_band_over_the_square():
    for keep, window in (((lambda i, j: j <= i), (-1, 0)), ((lambda i, j: i - 40 < j <= i), (40, 0)),
                         ((lambda i, j: j >= i), (1, -1)), ((lambda i, j: -30 <= j - i <= 20), (31, 20))):
        tiles = tiles_of(keep, grid(160, 16), grid(160, 16))
        schedule = ts.schedule(tiles, BIG)
        assert views(schedule) == [((0, 160), (0, 160), ts.BAND_PIECE, window, "top_left")]
        check_exact(schedule, keep, 160, 160)


def test_a_band_beside_the_diagonal_drops_the_rows_that_see_none_of_it():
    # j <= i - 40: rows 0-39 see no key; the view starts at row 40, where the band meets its corner.
    keep = lambda i, j: j <= i - 40  # noqa: E731
    schedule = ts.schedule(tiles_of(keep, grid(160, 16), grid(160, 16)), BIG)
    assert views(schedule) == [((40, 160), (0, 128), ts.BAND_PIECE, (-1, 0), "top_left")]
    check_exact(schedule, keep, 160, 160)


def test_window_placement_worked_by_hand():
    # Causal over rows 256-2048 of all 2048 keys: the bottom-right corner sits on the diagonal.
    assert cover.window_of((256, 2048), (0, 2048), (None, 0)) == ((256, 2048), (0, 2048), (-1, 0), "bottom_right")
    # The same band from the top-left corner (j - i = -256 there) would need right = 256: causal preferred.
    assert cover.window_of((256, 2048), (256, 2048), (None, 0)) == ((256, 2048), (256, 2048), (-1, 0), "top_left")
    # A sliding window of 64 on a view whose top-left corner is 128 keys past its first row's
    # diagonal: the band j - i in [-63, 0] is left of that corner, so the first keys go.
    placed = cover.window_of((128, 256), (0, 256), (-63, 0))
    assert placed[2:] == ((64, 0), "bottom_right") and placed[:2] == ((128, 256), (0, 256))
    # More rows than keys with a left bound: cuDNN would leave rows without a key.
    assert cover.window_of((0, 64), (0, 32), (-8, 8)) is None


def test_prefix_lm_from_its_own_cut_is_the_two_calls_over_the_rows():
    for s_q, s_kv, length in ((512, 512, 64), (512, 512, 50), (300, 500, 100), (64, 64, 80)):
        keep = lambda i, j: j <= i or j < length  # noqa: E731
        tiles = cover.prefix_tiles(length, s_q, s_kv)
        assert tiles == tiles_of(keep, tiles.rows, tiles.cols)  # the tiles as the pairs say
        schedule = ts.schedule(tiles, BIG)
        if length < s_q:  # (keys past the last row are no row's: the view stops there)
            assert views(schedule) == [((0, length), (0, length), ts.FULL_PIECE, (-1, -1), "top_left"),
                                       ((length, s_q), (0, min(s_q, s_kv)), ts.BAND_PIECE, (-1, 0), "bottom_right")]
        assert schedule.rows_apart and not schedule.empty_rows_inside
        check_exact(schedule, keep, s_q, s_kv)


def test_document_blocks_are_full_rectangles_and_their_edges_conditions(no_call_overhead):
    doc = [0] * 40 + [1] * 25 + [2] * 63 + [3] * 32
    keep = lambda i, j: doc[i] == doc[j]  # noqa: E731
    schedule = ts.schedule(tiles_of(keep, grid(160, 16), grid(160, 16)), BIG)
    assert {piece.mask for piece in schedule.pieces} == {ts.FULL_PIECE, ts.CONDITIONS_PIECE}
    assert schedule.empty_rows_inside and not schedule.rows_apart
    check_exact(schedule, keep, 160, 160)
    causal = lambda i, j: doc[i] == doc[j] and j <= i  # noqa: E731
    schedule = ts.schedule(tiles_of(causal, grid(160, 16), grid(160, 16)), BIG)
    assert ts.BAND_PIECE in {piece.mask for piece in schedule.pieces}  # inside each document: causal
    check_exact(schedule, causal, 160, 160)


def test_kernel_tiles_count_what_the_band_touches():
    assert ts.kernel_tiles(ts.Piece((0, 2048), (0, 2048), ts.BAND_PIECE, (-1, 0))) == 136  # 16 * 17 / 2
    assert ts.kernel_tiles(ts.Piece((256, 2048), (0, 2048), ts.BAND_PIECE, (-1, 0), "bottom_right")) == 133
    # A window of 256: a block of rows reaches 255 keys back, into the second block before its own.
    assert ts.kernel_tiles(ts.Piece((0, 2048), (0, 2048), ts.BAND_PIECE, (256, 0))) == 1 + 2 + 14 * 3
    assert ts.kernel_tiles(ts.Piece((0, 200), (0, 300), ts.FULL_PIECE)) == 2 * 3


def test_the_cost_model_worked_numbers():
    # Prefix-LM of 256 over 2 x 2k, 16 heads, d 128: 501 us as one masked call, 125 us split.
    schedule = ts.schedule(cover.prefix_tiles(256, 2048, 2048), BIG)
    assert not schedule.square and len(schedule.pieces) == 2
    assert schedule.square_us == pytest.approx(10 + 256 * BIG.tile_us() * 2.5) == pytest.approx(500.9, abs=0.1)
    assert schedule.cost_us == pytest.approx(2 * 10 + 137 * BIG.tile_us()) == pytest.approx(125.1, abs=0.1)
    # A checkerboard of 1024-blocks over 8192: 32 full rectangles, 24 merges of 1024 rows.
    kinds = tuple(tuple(cover.FULL if (a + b) % 2 == 0 else cover.EMPTY for b in range(8)) for a in range(8))
    checker = cover.Tiles(grid(8192, 1024), grid(8192, 1024), kinds, tuple((None,) * 8 for _ in range(8)))
    schedule = ts.schedule(checker, BIG)
    assert len(schedule.pieces) == 32 and sum(piece.merges for piece in schedule.pieces) == 24
    assert schedule.square_us == pytest.approx(7863.6, abs=0.1)
    assert schedule.cost_us == pytest.approx(32 * 10 + 2048 * BIG.tile_us() + 24 * (20 + 64 * 32 * 1024 * 128 / 3e6))
    assert schedule.cost_us == pytest.approx(4518, abs=1) and not schedule.square
    # 32 scattered PARTIAL tiles of 1024 x 1024 at b * h = 8, d = 64: one masked call (25 us).
    rng = random.Random(0)
    chosen = set(rng.sample([(a, b) for a in range(8) for b in range(8)], 32))
    scattered = lambda i, j: (i // 128, j // 128) in chosen and (i + j) % 2 == 0  # noqa: E731
    small = ts.Work(heads=8, head_dim=64)
    schedule = ts.schedule(tiles_of(scattered, grid(1024, 128), grid(1024, 128)), small)
    assert schedule.square and schedule.square_us == pytest.approx(25.3, abs=0.1)
    assert views(schedule) == [((0, 1024), (0, 1024), ts.CONDITIONS_PIECE, (-1, -1), "top_left")]
    assert schedule.cost_us > 32 * 10
    # The same prefix-LM on a small problem: a second call does not pay.
    assert ts.schedule(cover.prefix_tiles(50, 192, 192), ts.Work(heads=8, head_dim=16)).square


def test_without_conditions_a_mask_needs_its_bands_and_full_tiles():
    every_other = lambda i, j: j % 2 == 0  # noqa: E731
    tiles = tiles_of(every_other, grid(64, 16), grid(64, 16))
    assert ts.schedule(tiles, BIG, conditions=False) is None
    blocks = lambda i, j: (i // 16 + j // 16) % 3 == 0  # noqa: E731  (a BlockMask without a mask_mod)
    schedule = ts.schedule(tiles_of(blocks, grid(64, 16), grid(64, 16)), BIG, conditions=False)
    assert not schedule.square and {piece.mask for piece in schedule.pieces} == {ts.FULL_PIECE}
    check_exact(schedule, blocks, 64, 64)


def test_rows_no_piece_covers_and_a_mask_of_nothing():
    nothing = tiles_of(lambda i, j: False, grid(64, 16), grid(64, 16))
    schedule = ts.schedule(nothing, BIG, conditions=False)
    assert schedule.pieces == () and not schedule.square
    late = lambda i, j: i >= 32 and j < 16  # noqa: E731  (rows 0-31 see no key)
    schedule = ts.schedule(tiles_of(late, grid(64, 16), grid(64, 16)), BIG)
    assert views(schedule) == [((32, 64), (0, 16), ts.FULL_PIECE, (-1, -1), "top_left")]


def test_schedules_are_kept_by_their_tiles_and_work():
    tiles = cover.prefix_tiles(256, 2048, 2048)
    assert ts.schedule(tiles, BIG) is ts.schedule(cover.prefix_tiles(256, 2048, 2048), ts.Work(32, 128))
    assert ts.schedule(tiles, BIG) is not ts.schedule(tiles, ts.Work(64, 128))
