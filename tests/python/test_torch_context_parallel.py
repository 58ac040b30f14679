"""fusedattn.torch.context_parallel_attention's algorithm without a GPU: N simulated ranks in one
process (SimulatedRanks, in-process copies) and one gloo group of 4 processes (the process-group
transport's point-to-point sends and collectives), with stand-in block kernels in float64 math that
use the O and statistics they are given, as cuDNN's backward does; against attention of the whole
sequence, outputs and gradients, ring and all-gather side by side on the same inputs, causal
load-balanced, contiguous and not causal, windows, GQA, sinks; packed sequences (thd) against each
sequence's own attention."""
import functools
import os
import re
import subprocess
import sys
from typing import NamedTuple, Optional, Tuple

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

import torch.distributed as dist  # noqa: E402

from fusedattn import InvalidArgumentError, _config  # noqa: E402
from fusedattn import _context_parallel as _cp  # noqa: E402
from fusedattn.torch import _context_parallel as cp  # noqa: E402
from fusedattn.torch._cp_blocks import FusedattnBlocks  # noqa: E402
from fusedattn.torch._cp_schedule import _Kinds, run_backward, run_forward  # noqa: E402
from fusedattn.torch._cp_transports import SimulatedRanks  # noqa: E402

SCHEMES = ("ring", "all_gather")

# Every problem here is GQA (4 query heads on 2 key/value heads), standing for MHA too: the schedule
# and the transports never look at head counts (a block is whatever k and v hold; dK, dV are shaped
# as k and v), and the stand-in kernels' MHA is their group of one (a repeat and a sum over one
# head). GQA checks more: k and v narrower than q catch a dK shaped or summed as dQ. (fusedattn's
# own kernels do treat the two apart: the GPU tests keep both.)
H_KV = 2


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tensors of a few thousand elements: intra-op threads buy nothing here but their start and
    spin, and under ctest -j16 (16 files at once, each torch with a thread per core) they were most
    of this file's time. On 2 cores the simulated ranks took 36 s of CPU with 2 threads, 3 s with 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def visible(rows, cols, mask, device="cpu"):
    """Which (query, key) pairs of a piece its mask (_context_parallel.pieces) lets through: all,
    the window (L, R) from the top-left, i - L < j <= i + R (-1: no bound; causal: (-1, 0)), the
    band j - i >= offset (BAND_PIECE) or j - i <= offset (BAND_UPPER), or one sequence's band
    low <= j - i <= high (SEQUENCE_BAND)."""
    kind, value = mask
    i, j = torch.arange(rows, device=device)[:, None], torch.arange(cols, device=device)[None, :]
    if kind == _cp.FULL:
        return torch.ones(rows, cols, dtype=torch.bool, device=device)
    if kind == _cp.DIAGONAL:
        left, right = value
        return ((j > i - left) if left >= 0 else True) & ((j <= i + right) if right >= 0 else True)
    if kind == _cp.BAND_UPPER:
        return j - i <= value
    if kind == _cp.SEQUENCE_BAND:  # one sequence's bounds (ReferenceBlocks hands each its own)
        low, high = value
        return (j - i >= low) & (j - i <= high)
    assert kind == _cp.BAND_PIECE, mask
    return j - i >= value


class ReferenceBlocks:
    """The block kernels in plain torch (float64): forward (O, statistics) and the backward formula
    with the O and statistics given, under a piece's mask. A row a mask leaves empty gets what the
    arithmetic gives (statistic -inf, O NaN): the merge must take nothing from it."""

    def __init__(self, scale):
        self.scale = scale
        self.masks = []  # every mask the algorithm asked for

    def _scores(self, q, k, mask):
        self.masks.append(mask)
        k = k.repeat_interleave(q.shape[2] // k.shape[2], 2)
        s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * self.scale
        return s.masked_fill(~visible(s.shape[-2], s.shape[-1], mask, s.device), float("-inf"))

    def forward(self, q, k, v, mask, packed=None):
        if packed is not None:  # each sequence alone, its statistics by token
            outs = [self.forward(*x, sequence_mask(mask, i)) for i, x in enumerate(per_sequence(packed, q, k, v))]
            return torch.cat([o[0] for o, _ in outs]), torch.cat([st[0].transpose(0, 1) for _, st in outs])
        s = self._scores(q, k, mask)
        stats = torch.logsumexp(s, -1)
        p = torch.exp(s - stats[..., None])
        o = torch.einsum("bhqk,bkhd->bqhd", p, v.double().repeat_interleave(q.shape[2] // v.shape[2], 2))
        return o, stats

    def backward(self, q, k, v, o, stats, d_o, mask, packed=None):
        if packed is not None:
            grads = [self.backward(q_, k_, v_, o_, st.transpose(1, 2), d_o_, sequence_mask(mask, i))
                     for i, (q_, k_, v_, o_, st, d_o_) in enumerate(per_sequence(packed, q, k, v, o, stats, d_o))]
            return tuple(torch.cat([g[i][0] for g in grads]) for i in range(3))
        group = q.shape[2] // k.shape[2]
        p = torch.exp(self._scores(q, k, mask) - stats[..., None].double())
        ke, ve = k.double().repeat_interleave(group, 2), v.double().repeat_interleave(group, 2)
        d_p = torch.einsum("bqhd,bkhd->bhqk", d_o.double(), ve)
        row = torch.einsum("bqhd,bqhd->bhq", d_o.double(), o.double())[..., None]
        d_s = p * (d_p - row) * self.scale
        fold = lambda x: x.reshape(x.shape[0], x.shape[1], k.shape[2], group, x.shape[3]).sum(3)
        return (torch.einsum("bhqk,bkhd->bqhd", d_s, ke), fold(torch.einsum("bhqk,bqhd->bkhd", d_s, q.double())),
                fold(torch.einsum("bhqk,bqhd->bkhd", p, d_o.double())))


def sequence_mask(mask, i):
    """Sequence i's share of a packed call's mask: its own bounds of a per-sequence band."""
    if mask[0] != _cp.SEQUENCE_BAND:
        return mask
    low, high = mask[1]
    return mask[0], (int(low[i]), int(high[i]))


def per_sequence(packed, *tensors):
    """Each sequence's slices of packed tensors ([tokens, ...], offsets packed.cu), as a batch of one."""
    cu = packed.cu.tolist()
    return [tuple(t[cu[i]:cu[i + 1]][None] for t in tensors) for i in range(len(cu) - 1)]


def whole(q, k, v, causal, scale, sink=None, window=None):
    """Attention of the whole sequence; a sink adds e^sink[h] to every row's denominator; `window`:
    a sliding window's bounds (L, R)."""
    group = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(group, 2)) * scale
    if causal or window is not None:
        mask = (_cp.DIAGONAL, window or (-1, 0))
        s = s.masked_fill(~visible(s.shape[-2], s.shape[-1], mask, s.device), float("-inf"))
    if sink is not None:
        column = sink.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        p = torch.softmax(torch.cat([s, column], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v.repeat_interleave(group, 2))


def problem(h_kv, seed=0, b=2, s=128, h_q=4, d=16):
    g = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(b, s, h, d, generator=g, dtype=torch.float64)
    return make(h_q), make(h_kv), make(h_kv), make(h_q)


def packed_problem(h_kv, lengths, seed=0, h_q=4, d=16):
    """Packed q, k, v, dO ([tokens, h, d], float64) and the batch's int32 offsets."""
    g = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(sum(lengths), h, d, generator=g, dtype=torch.float64)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return make(h_q), make(h_kv), make(h_kv), make(h_q), cu


def whole_packed(q, k, v, cu, causal, scale, sink=None, window=None):
    """Each sequence's own attention (whole), packed again."""
    bounds = cu.tolist()
    return torch.cat([whole(*(t[a:b][None] for t in (q, k, v)), causal, scale, sink, window)[0]
                      for a, b in zip(bounds, bounds[1:])])


def run_packed(n, q, k, v, d_o, cu, causal, balanced, scheme, blocks, sink=None, device="cpu", out_dtype=None,
               window=None):
    """Packed parts through N simulated ranks: (O, grads, dSink per rank), restored to the batch's
    order; O goes into the backward in `out_dtype` (as a caller's would), default its own."""
    arrange = lambda x: cp.load_balance(x, n, cu_seqlens=cu, balanced=balanced)
    restore = lambda x: cp.unbalance(x, n, cu_seqlens=cu, balanced=balanced)
    packed = cp.Packed(cu, n, balanced, device)
    parts = [[packed.halves(p.contiguous()) for p in arrange(x).chunk(n, 0)] for x in (q, k, v, d_o)]
    ranks = SimulatedRanks(n)
    outs = run_forward(parts[0], parts[1], parts[2], ranks, blocks, causal=causal, balanced=balanced, scheme=scheme,
                       sink=sink, window=window, packed=packed)
    os_ = [o if out_dtype is None else o.to(out_dtype) for o, _ in outs]
    grads, d_sinks = run_backward(parts[0], parts[1], parts[2], os_, [s for _, s in outs],
                                  parts[3], ranks, blocks, causal=causal, balanced=balanced, scheme=scheme, sink=sink,
                                  window=window, packed=packed)
    whole_batch = lambda per_rank: restore(torch.cat([packed.restore(x) for x in per_rank]))
    return whole_batch(os_), [whole_batch([g[i] for g in grads]) for i in range(3)], d_sinks


def sink_logits(heads):
    """A learnable sink's logits, the same on every rank and process: both signs, each head its own."""
    return torch.linspace(-1, 1, heads, dtype=torch.float64)


class Expected(NamedTuple):
    """Attention of the whole sequence (packed: of each sequence alone) and its gradients."""
    o: torch.Tensor
    grads: Tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # dQ, dK, dV
    d_sink: Optional[torch.Tensor]  # None without a sink


@functools.lru_cache(maxsize=None)
def expected(causal, window=None, with_sink=False, lengths=None, seed=0):
    """The answer for problem(H_KV, seed), or packed_problem(H_KV, lengths, seed) with `lengths` (a
    tuple), with sink_logits if `with_sink`: made once per inputs and shared, since every scheme,
    rank count and arrangement of the same inputs must give it. Callers only read it."""
    if lengths is None:
        q, k, v, d_o = problem(H_KV, seed)
        attend = lambda q, k, v, sink: whole(q, k, v, causal, q.shape[-1] ** -0.5, sink, window)
    else:
        q, k, v, d_o, cu = packed_problem(H_KV, lengths, seed)
        attend = lambda q, k, v, sink: whole_packed(q, k, v, cu, causal, q.shape[-1] ** -0.5, sink, window)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    sink = sink_logits(q.shape[-2]).requires_grad_() if with_sink else None
    o = attend(*leaves, sink)
    o.backward(d_o)
    return Expected(o.detach(), tuple(leaf.grad for leaf in leaves), sink.grad if with_sink else None)


def assert_answer(got, want, label):
    """(O, [dQ, dK, dV], dSink per rank or None), restored to the whole sequence's order, against
    an Expected: O to 1e-10, the gradients to 1e-9."""
    o, grads, d_sinks = got
    assert torch.allclose(o, want.o, atol=1e-10), label
    for name, grad, want_grad in zip(("dq", "dk", "dv"), grads, want.grads):
        assert torch.allclose(grad, want_grad, atol=1e-9), f"{label}: {name}"
    if want.d_sink is None:
        assert d_sinks is None, label
        return
    for d_sink in d_sinks:  # summed over the ranks: every rank holds the whole gradient
        assert torch.allclose(d_sink, want.d_sink, atol=1e-9), f"{label}: dsink"


def run_parts(n, q, k, v, d_o, causal, balanced, scheme, blocks, sink=None, window=None):
    """Parts of bshd q, k, v, dO (load-balanced, or contiguous chunks) through N simulated ranks:
    (O, grads, dSink per rank), restored to the sequence's order."""
    arrange = (lambda x: cp.load_balance(x, n)) if balanced else (lambda x: x)
    restore = (lambda x: cp.unbalance(x, n)) if balanced else (lambda x: x)
    parts = [arrange(x).chunk(n, 1) for x in (q, k, v, d_o)]
    ranks = SimulatedRanks(n)
    outs = run_forward(parts[0], parts[1], parts[2], ranks, blocks, causal=causal, balanced=balanced, scheme=scheme,
                       sink=sink, window=window)
    grads, d_sinks = run_backward(parts[0], parts[1], parts[2], [o for o, _ in outs], [s for _, s in outs],
                                  parts[3], ranks, blocks, causal=causal, balanced=balanced, scheme=scheme, sink=sink,
                                  window=window)
    whole_sequence = lambda per_rank: restore(torch.cat(per_rank, 1))
    return whole_sequence([o for o, _ in outs]), [whole_sequence([g[i] for g in grads]) for i in range(3)], d_sinks


CASES = [(False, False), (True, True), (True, False)]
IDS = ["full", "causal_balanced", "causal_contiguous"]


@pytest.mark.parametrize("causal, balanced", CASES, ids=IDS)
@pytest.mark.parametrize("n", [2, 4])
def test_simulated_ranks_equal_the_whole_sequence(causal, balanced, n):
    q, k, v, d_o = problem(H_KV)
    for scheme in SCHEMES:
        got = run_parts(n, q, k, v, d_o, causal, balanced, scheme, ReferenceBlocks(q.shape[-1] ** -0.5))
        assert_answer(got, expected(causal), f"{scheme}, {n} ranks")


@pytest.mark.parametrize("causal, balanced", [(True, True), (False, False)], ids=["causal_balanced", "full"])
def test_a_sink_joins_each_row_once_and_gets_its_gradient_summed_over_the_ranks(causal, balanced):
    q, k, v, d_o = problem(H_KV)
    for scheme in SCHEMES:
        got = run_parts(4, q, k, v, d_o, causal, balanced, scheme, ReferenceBlocks(q.shape[-1] ** -0.5),
                        sink=sink_logits(q.shape[2]))
        assert_answer(got, expected(causal, with_sink=True), scheme)


def test_a_rank_that_sees_no_key_of_a_block_takes_a_neutral_statistic():
    # Contiguous causal chunks: rank 0 sees nothing of rank 1's keys; the merge must leave it alone.
    q, k, v, _ = problem(4)
    ranks, blocks = SimulatedRanks(2), ReferenceBlocks(0.25)
    outs = run_forward(q.chunk(2, 1), k.chunk(2, 1), v.chunk(2, 1), ranks, blocks, causal=True, balanced=False,
                       scheme="ring")
    alone = blocks.forward(q.chunk(2, 1)[0], k.chunk(2, 1)[0], v.chunk(2, 1)[0], (_cp.DIAGONAL, (-1, 0)))
    assert torch.allclose(outs[0][0], alone[0]) and torch.allclose(outs[0][1], alone[1])


# Sequences of 24, 0 (empty), 8 and 48 tokens: multiples of 2N = 8, the chunks of 1 to 6 tokens.
PACKED_LENGTHS = (24, 0, 8, 48)


@pytest.mark.parametrize("causal, balanced", CASES, ids=IDS)
@pytest.mark.parametrize("n", [2, 4])
def test_packed_sequences_equal_each_sequences_own_attention(causal, balanced, n):
    q, k, v, d_o, cu = packed_problem(H_KV, PACKED_LENGTHS)
    for scheme in SCHEMES:
        got = run_packed(n, q, k, v, d_o, cu, causal, balanced, scheme, ReferenceBlocks(q.shape[-1] ** -0.5))
        assert_answer(got, expected(causal, lengths=PACKED_LENGTHS), f"{scheme}, {n} ranks")


def test_packed_sequences_with_a_sink():
    lengths = (16, 4, 12)
    q, k, v, d_o, cu = packed_problem(H_KV, lengths)
    got = run_packed(2, q, k, v, d_o, cu, True, True, "ring", ReferenceBlocks(q.shape[-1] ** -0.5),
                     sink_logits(q.shape[1]))
    assert_answer(got, expected(True, with_sink=True, lengths=lengths), "ring")


def test_packed_parts_worked_numbers():
    # Two sequences of 8 and 16 tokens over 2 ranks, balanced: chunks of 2 and 4 tokens. Rank 0
    # holds chunks 0 and 3 of each: tokens 0-1, 6-7 of the first, 8-11, 20-23 of the second.
    cu = torch.tensor([0, 8, 24], dtype=torch.int32)
    order = cp._packed_order(cu, 2, True).tolist()
    assert order[:12] == [0, 1, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23]
    assert order[12:] == [2, 3, 4, 5, 12, 13, 14, 15, 16, 17, 18, 19]
    x = torch.arange(24)
    assert torch.equal(cp.unbalance(cp.load_balance(x, 2, cu_seqlens=cu), 2, cu_seqlens=cu), x)
    # The rank's part (offsets 0, 4, 12) in halves: first chunks 0-1, 4-7, then second 2-3, 8-11,
    # each half a packed batch with offsets 0, 2, 6.
    packed = cp.Packed(cu, 2, True, "cpu")
    assert packed.order.tolist() == [0, 1, 4, 5, 6, 7, 2, 3, 8, 9, 10, 11]
    assert packed.cu.tolist() == [0, 2, 6] and packed.max_seqlen == 4 and packed.tokens == 12
    assert torch.equal(packed.restore(packed.halves(torch.arange(12))), torch.arange(12))
    # Without load balancing: chunk r of 2, the part not reordered.
    contiguous = cp.Packed(cu, 2, False, "cpu")
    assert contiguous.order is None and contiguous.cu.tolist() == [0, 4, 12]
    assert cp._packed_order(cu, 2, False).tolist()[:12] == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15]


def test_packed_sequences_that_do_not_split_evenly_are_refused():
    with pytest.raises(InvalidArgumentError) as caught:
        cp.Packed(torch.tensor([0, 8, 18], dtype=torch.int32), 2, True, "cpu")
    assert caught.value.field == "cu_seqlens" and "sequence 1 of length 10" in str(caught.value)
    assert "multiples of 4" in str(caught.value)
    with pytest.raises(InvalidArgumentError):
        cp.Packed(torch.tensor([1, 8], dtype=torch.int32), 2, False, "cpu")  # not from 0


# Sequences of 48, 0, 8, 24 and 64 tokens (chunks of 6, 0, 1, 3 and 8 balanced over 4 ranks; 12, 0,
# 2, 6 and 16 contiguous): a window ends inside some sequences' chunk pairs, covers others' and
# misses others', so one piece meets every kind at once.
PACKED_WINDOW_LENGTHS = (48, 0, 8, 24, 64)


@pytest.mark.parametrize("causal, balanced, window", [(True, True, (5, 0)), (True, True, (13, 0)),
                                                      (True, False, (7, 0)), (True, False, (30, 0)),
                                                      (False, False, (4, 9)), (False, False, (-1, 20)),
                                                      (False, False, (20, -1))],
                         ids=["causal_balanced_window5", "causal_balanced_window13", "causal_contiguous_window7",
                              "causal_contiguous_window30", "window4_9", "window_open_20", "window20_open"])
def test_packed_sequences_under_a_window_equal_each_sequences_own_attention(causal, balanced, window):
    q, k, v, d_o, cu = packed_problem(H_KV, PACKED_WINDOW_LENGTHS, seed=3)
    for scheme in SCHEMES:
        blocks = ReferenceBlocks(q.shape[-1] ** -0.5)
        got = run_packed(4, q, k, v, d_o, cu, causal, balanced, scheme, blocks, window=window)
        assert_answer(got, expected(causal, window, lengths=PACKED_WINDOW_LENGTHS, seed=3), scheme)
        assert _cp.SEQUENCE_BAND in {kind for kind, _ in blocks.masks}, scheme


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


def window_masks(balanced, window, causal):
    """A windowed problem (4 ranks of 32 tokens) through 4 simulated ranks by each scheme against
    the whole sequence; returns, per scheme, the kinds of masks the block kernels were asked for."""
    q, k, v, d_o = problem(H_KV)
    kinds = {}
    for scheme in SCHEMES:
        blocks = ReferenceBlocks(q.shape[-1] ** -0.5)
        got = run_parts(4, q, k, v, d_o, causal, balanced, scheme, blocks, window=window)
        assert_answer(got, expected(causal, window), scheme)
        kinds[scheme] = {kind for kind, _ in blocks.masks}
    return kinds


@pytest.mark.parametrize("balanced", [True, False], ids=["balanced", "contiguous"])
@pytest.mark.parametrize("left", [1, 2, 5, 16, 40, 64, 100], ids=lambda w: f"window{w}")
def test_a_causal_sliding_window_equals_the_whole_sequence(balanced, left):
    # 4 ranks of 32 tokens (balanced: chunks of 16): windows inside a chunk, of one chunk, across
    # several, and wider than a rank's part.
    for scheme, kinds in window_masks(balanced, (left, 0), True).items():
        if left in (5, 40):  # windows that end inside a chunk need the band
            assert _cp.BAND_PIECE in kinds, (scheme, kinds)


@pytest.mark.parametrize("window", [(5, 3), (40, 20), (3, 40), (-1, 40), (40, -1), (100, 100), (1, 1)],
                         ids=lambda w: f"window{w[0]}_{w[1]}")
def test_a_two_sided_window_equals_the_whole_sequence(window):
    # Not causal, contiguous ranks of 32 tokens: bounds inside a chunk, across one on either side,
    # one side open, wider than the sequence; bands above the diagonal (keys on later ranks) too.
    for scheme, kinds in window_masks(False, window, False).items():
        if window in ((40, 20), (3, 40)):
            assert {_cp.BAND_PIECE, _cp.BAND_UPPER} & kinds, (scheme, kinds)
        if window == (3, 40):
            assert _cp.BAND_UPPER in kinds, (scheme, kinds)


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


def test_windows_that_are_not_windows_are_refused():
    q = torch.zeros(1, 8, 2, 16)
    for window, causal in (((0, 0), False), ((4, 4), True), ((-2, 3), False)):
        with pytest.raises(InvalidArgumentError) as caught:  # refused before any process group is asked
            fa.context_parallel_attention(q, q, q, window=window, causal=causal)
        assert caught.value.field == "window"


def test_bad_arguments_name_the_field():
    q = torch.zeros(1, 7, 2, 16)
    for kwargs, field in ((dict(causal=True), "q.shape"), (dict(scheme="tree"), "scheme")):
        with pytest.raises(InvalidArgumentError) as caught:
            fa.context_parallel_attention(q, q, q, **kwargs)  # refused before any process group is asked
        assert caught.value.field == field
    with pytest.raises(InvalidArgumentError) as caught:
        fa.context_parallel_attention(q, q[:, :6], q[:, :6], causal=True, load_balanced=False)
    assert caught.value.field == "k.shape"


class GlooConfig(NamedTuple):
    """One configuration the gloo group checks; left > 0: a causal sliding window of that many keys."""
    scheme: str
    causal: bool
    balanced: bool
    with_sink: bool = False
    left: int = -1
    packed: bool = False


# One group of four processes checks them all, one after another: a group costs seconds of CPU to
# start (each process its interpreter and torch), a configuration milliseconds.
GLOO_CONFIGS = {
    "ring_causal": GlooConfig("ring", True, True), "all_gather_causal": GlooConfig("all_gather", True, True),
    "ring_full": GlooConfig("ring", False, False), "all_gather_full": GlooConfig("all_gather", False, False),
    "ring_causal_sink": GlooConfig("ring", True, True, with_sink=True),
    "ring_window": GlooConfig("ring", True, False, left=40),
    "ring_causal_packed_sink": GlooConfig("ring", True, True, with_sink=True, packed=True),
    "all_gather_packed_window": GlooConfig("all_gather", True, True, left=13, packed=True),
}


def gloo_rank_agrees(rank, n, config):
    """This process's rank of the group through context_parallel_attention (its part of q, k, v;
    its O and gradients) against its part of the whole sequence's answer."""
    window = (config.left, 0) if config.left > 0 else None
    if config.packed:  # a packed batch (thd), each rank its chunks of every sequence
        q, k, v, d_o, cu = packed_problem(H_KV, PACKED_LENGTHS)
        arrange, axis = lambda x: cp.load_balance(x, n, cu_seqlens=cu, balanced=config.balanced), 0
        want = expected(config.causal, window, config.with_sink, lengths=PACKED_LENGTHS)
    else:
        q, k, v, d_o = problem(H_KV)
        arrange = (lambda x: cp.load_balance(x, n)) if config.balanced else (lambda x: x)
        cu, axis = None, 1
        want = expected(config.causal, window, config.with_sink)
    mine = lambda x: arrange(x).chunk(n, axis)[rank].clone()
    leaves = [mine(x).requires_grad_() for x in (q, k, v)]
    sink = sink_logits(q.shape[-2]).requires_grad_() if config.with_sink else None
    o = cp.context_parallel_attention(*leaves, causal=config.causal, window=window or (-1, -1), scheme=config.scheme,
                                      load_balanced=config.balanced, sink=sink, cu_seqlens=cu,
                                      blocks=ReferenceBlocks(q.shape[-1] ** -0.5))
    o.backward(mine(d_o))
    ok = torch.allclose(o, mine(want.o), atol=1e-10)
    for leaf, want_grad in zip(leaves, want.grads):
        ok = ok and torch.allclose(leaf.grad, mine(want_grad), atol=1e-9)
    if config.with_sink:  # summed over the ranks: every rank holds the whole gradient
        ok = ok and torch.allclose(sink.grad, want.d_sink, atol=1e-9)
    return ok


def gloo_rank(rank, n, store):
    """One process of the group (forked from `python this_file.py STORE`): every configuration."""
    torch.set_num_threads(1)  # four ranks on the machine, tensors of a few thousand elements
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
    for name, config in GLOO_CONFIGS.items():
        print(f"RANK {rank} {name} {'OK' if gloo_rank_agrees(rank, n, config) else 'WRONG'}", flush=True)
    dist.destroy_process_group()


def test_a_gloo_group_of_four_processes_equals_the_whole_sequence(tmp_path):
    # A fresh interpreter forks the four ranks once it has imported torch and this file: they share
    # that import. The group meets in a file store, so no port is chosen that another test might hold.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, __file__, str(tmp_path / "store")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    # The four processes share stdout: their lines may run into each other.
    seen = sorted(re.findall(r"RANK (\d) (\w+) (OK|WRONG)", done.stdout))
    wrong = [f"rank {rank}: {name}" for rank, name, verdict in seen if verdict != "OK"]
    assert seen == sorted((str(r), name, "OK") for r in range(4) for name in GLOO_CONFIGS), (wrong, done.stdout)


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


if __name__ == "__main__":  # the gloo group of test_a_gloo_group_of_four_processes_equals_the_whole_sequence
    torch.multiprocessing.start_processes(gloo_rank, args=(4, sys.argv[1]), nprocs=4, start_method="fork")
