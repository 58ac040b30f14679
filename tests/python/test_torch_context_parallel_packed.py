"""fusedattn.torch.context_parallel_attention on packed sequences (thd) without a GPU: N simulated
ranks in one process with the float64 stand-in kernels of torch_cp_reference.py, against each
sequence's own attention, outputs and gradients, ring and all-gather, with sinks and under windows;
the packed parts' order in worked numbers, and batches that do not split evenly refused."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn import InvalidArgumentError  # noqa: E402
from fusedattn import _context_parallel as _cp  # noqa: E402
from fusedattn.torch import _context_parallel as cp  # noqa: E402
from torch_cp_reference import (CASES, H_KV, IDS, PACKED_LENGTHS, SCHEMES, ReferenceBlocks,  # noqa: E402
                                assert_answer, expected, packed_problem, run_packed, sink_logits)
from torch_cp_reference import one_thread  # noqa: E402, F401  (autouse: this file's tests run on one thread)


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
