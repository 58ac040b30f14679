"""Context parallelism's pieces without a GPU, in worked numbers: which part of a rank's queries
meets which part of another rank's keys under which mask (windows, bands, each packed sequence's
band), and the spec string and runtime scalars fusedattn's block kernels are asked for each."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn import _config  # noqa: E402
from fusedattn import _context_parallel as _cp  # noqa: E402
from fusedattn.torch import _context_parallel as cp  # noqa: E402
from fusedattn.torch._cp_blocks import FusedattnBlocks  # noqa: E402
from fusedattn.torch._cp_schedule import _Kinds  # noqa: E402


def test_window_pieces_worked_numbers():
    # The core's windows: key j visible to query i where i - L < j <= i + R. Contiguous ranks of 32
    # tokens, a causal window of 40 keys: rank 2's queries (64..95) see rank 1's keys (32..63) as a
    # band j - i >= 32 - 40 + 1 = -7, rank 0's as a band 64 - 39 = 25 (only its last keys, to its
    # first queries), and nothing of rank 3's.
    pieces = lambda source: _cp.window_pieces(2, source, 4, balanced=False, length=32, bounds=(40, 0))
    assert pieces(2) == [("all", "all", (_cp.DIAGONAL, (40, 0)))]
    assert pieces(1) == [("all", "all", (_cp.BAND_PIECE, -7))]
    assert pieces(0) == [("all", "all", (_cp.BAND_PIECE, 25))]
    assert pieces(3) == []
    # A window of 100: rank 1's keys are all inside it (offset 32 - 99 = -67 <= -31), and rank 0's
    # too (64 - 99 = -35 <= -31): full pieces.
    assert _cp.window_pieces(2, 1, 4, balanced=False, length=32, bounds=(100, 0)) == [("all", "all", (_cp.FULL, 0))]
    assert _cp.window_pieces(2, 0, 4, balanced=False, length=32, bounds=(100, 0)) == [("all", "all", (_cp.FULL, 0))]
    # A window of 2: query 64 still sees key 63, rank 1's last (a band of offset 31, one pair); a
    # window of 1 is the diagonal alone, so rank 1's keys are hidden (offset 32 >= 32).
    assert (_cp.window_pieces(2, 1, 4, balanced=False, length=32, bounds=(2, 0))
            == [("all", "all", (_cp.BAND_PIECE, 31))])
    assert _cp.window_pieces(2, 1, 4, balanced=False, length=32, bounds=(1, 0)) == []
    # Balanced (chunks of 16): rank 0 holds chunks 0 and 7; against its own keys under a window of
    # 16, chunk 7 sees chunk 0 not at all (offset 7 * 16 - 15 = 97 >= 16).
    assert _cp.window_pieces(0, 0, 4, balanced=True, length=32, bounds=(16, 0)) == [
        ("first", "first", (_cp.DIAGONAL, (16, 0))), ("second", "second", (_cp.DIAGONAL, (16, 0)))]
    # Two-sided (3, 40), not causal: rank 2's queries see rank 3's keys (96..127) as a band
    # j - i <= -32 + 40 = 8 (keys later), rank 1's as a band j - i >= 32 - 2 = 30, rank 0's not at
    # all (64 - 2 >= 32). Rank 3's keys under a right bound of 100 or none: all inside (full); of 31:
    # a band j - i <= -1 (query 64 sees key 95 alone); of 0: none (-32 <= -32).
    two_sided = lambda source, window: _cp.window_pieces(2, source, 4, balanced=False, length=32, bounds=window)
    assert two_sided(2, (3, 40)) == [("all", "all", (_cp.DIAGONAL, (3, 40)))]
    assert two_sided(3, (3, 40)) == [("all", "all", (_cp.BAND_UPPER, 8))]
    assert two_sided(1, (3, 40)) == [("all", "all", (_cp.BAND_PIECE, 30))]
    assert two_sided(0, (3, 40)) == []
    assert two_sided(3, (40, 100)) == [("all", "all", (_cp.FULL, 0))]
    assert two_sided(3, (40, -1)) == [("all", "all", (_cp.FULL, 0))]
    assert two_sided(3, (40, 31)) == [("all", "all", (_cp.BAND_UPPER, -1))]
    assert two_sided(3, (40, 0)) == []


def test_packed_window_pieces_worked_numbers():
    # Contiguous parts of sequences of 8, 32 and 0 tokens over 4 ranks: chunks of 2, 8 and 0. A
    # causal window of 6 keys, rank 2's queries against rank 1's keys (m = 1): each sequence's
    # bounds of j - i are m c - 6 + 1 = c - 5 and m c + 0 = c, so -3 <= j - i <= 2 for the first
    # (its chunk of 2 is covered), 3 <= j - i <= 8 for the second (a band); rank 0's keys (m = 2):
    # 2c - 5 = -1 .. 4 (covered) and 11 .. 16 (missed, 11 >= 8).
    packed = cp.Packed(torch.tensor([0, 8, 40, 40], dtype=torch.int32), 4, False, "cpu")
    kinds = _Kinds(None, True, False, 4, (6, 0), packed)
    ((q_part, k_part, (kind, (low, high))),) = kinds._pieces(2, 1, 10)
    assert (q_part, k_part, kind) == ("all", "all", _cp.SEQUENCE_BAND)
    assert low.tolist()[:2] == [-3, 3] and high.tolist()[:2] == [2, 8]
    ((_, _, (kind, (low, high))),) = kinds._pieces(2, 0, 10)
    assert kind == _cp.SEQUENCE_BAND and low.tolist()[:2] == [-1, 11] and high.tolist()[:2] == [4, 16]
    assert kinds._pieces(2, 2, 10) == [("all", "all", (_cp.DIAGONAL, (6, 0)))]
    assert kinds._pieces(2, 3, 10) == []  # later keys, causal: every sequence's pair missed
    # A window of 40 covers every sequence's pair with rank 1's keys: a plain piece.
    assert _Kinds(None, True, False, 4, (40, 0), packed)._pieces(2, 1, 10) == [("all", "all", (_cp.FULL, 0))]


def test_the_block_kernels_configs_for_window_pieces():
    # What fusedattn's kernels are asked for (the spec string of each piece's call): the diagonal
    # with its window (causal, or two-sided), a full piece, and the bands with one runtime scalar.
    blocks = FusedattnBlocks(0.125)
    diagonal = str(_config.parse(blocks._config((_cp.DIAGONAL, (300, 0)))))
    assert "window=300,0" in diagonal and "score_mod" not in diagonal
    assert "window=-1,0" in str(_config.parse(blocks._config((_cp.DIAGONAL, (-1, 0)))))
    assert "window=300,200" in str(_config.parse(blocks._config((_cp.DIAGONAL, (300, 200)))))
    full = str(_config.parse(blocks._config((_cp.FULL, 0))))
    assert "window" not in full and "score_mod" not in full
    band = str(_config.parse(blocks._config((_cp.BAND_PIECE, 24))))
    assert "score_mod=select(ge(sub(kv,q),$0),score,-inf)" in band and "window" not in band
    below = str(_config.parse(blocks._config((_cp.BAND_UPPER, -5))))
    assert "score_mod=select(le(sub(kv,q),$0),score,-inf)" in below and "window" not in below
    extras = blocks._extras((_cp.BAND_PIECE, 24), torch.zeros(1))
    assert extras.mod_scalars.tolist() == [24.0] and blocks._extras((_cp.FULL, 0), torch.zeros(1)).mod_scalars is None
    assert blocks._extras((_cp.BAND_UPPER, -5), torch.zeros(1)).mod_scalars.tolist() == [-5.0]
    # Packed halves under a window: each sequence's band, its bounds the modifier's two tensors.
    packed = cp.Packed(torch.tensor([0, 8, 40], dtype=torch.int32), 4, False, "cpu")
    bounds = (torch.tensor([-3, 3]), torch.tensor([2, 8]))
    per_sequence_band = str(_config.parse(blocks._config((_cp.SEQUENCE_BAND, bounds), packed)))
    assert "score_mod=select(and(ge(sub(kv,q),t0[b]),le(sub(kv,q),t1[b])),score,-inf)" in per_sequence_band
    assert "window" not in per_sequence_band
    extras = blocks._extras((_cp.SEQUENCE_BAND, bounds), torch.zeros(1), packed)
    assert extras.mod_t0.tolist() == [-3.0, 3.0] and extras.mod_t1.tolist() == [2.0, 8.0]
    assert extras.mod_t0.dtype == torch.float32 and extras.mod_scalars is None
