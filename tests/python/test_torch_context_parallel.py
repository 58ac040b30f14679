"""fusedattn.torch.context_parallel_attention's algorithm without a GPU: N simulated ranks in one
process (SimulatedRanks, in-process copies), with stand-in block kernels in float64 math that use
the O and statistics they are given, as cuDNN's backward does (torch_cp_reference.py); against
attention of the whole sequence, outputs and gradients, ring and all-gather side by side on the same
inputs, causal load-balanced, contiguous and not causal, windows, GQA, sinks; and the arguments it
refuses. Packed sequences: test_torch_context_parallel_packed.py; a gloo group of processes:
test_torch_context_parallel_gloo.py; the pieces' rules in worked numbers:
test_torch_context_parallel_pieces.py."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn import InvalidArgumentError  # noqa: E402
from fusedattn import _context_parallel as _cp  # noqa: E402
from fusedattn.torch._cp_schedule import run_forward  # noqa: E402
from fusedattn.torch._cp_transports import SimulatedRanks  # noqa: E402
from torch_cp_reference import (CASES, H_KV, IDS, SCHEMES, ReferenceBlocks, assert_answer, expected,  # noqa: E402
                                problem, run_parts, sink_logits)
from torch_cp_reference import one_thread  # noqa: E402, F401  (autouse: this file's tests run on one thread)


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
