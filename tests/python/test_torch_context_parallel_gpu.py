"""Context parallelism on one GPU: N simulated ranks in one process (in-process copies for the
transport) running fusedattn's block kernels, against float32 attention of the whole sequence,
outputs and gradients, ring and all-gather, causal load-balanced and not causal, causal sliding
windows, GQA, packed sequences (thd), windows among them, against each sequence's own attention."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")

from fusedattn.torch import _context_parallel as cp  # noqa: E402
from fusedattn.torch._cp_blocks import FusedattnBlocks  # noqa: E402
from fusedattn.torch._cp_schedule import run_backward, run_forward  # noqa: E402
from fusedattn.torch._cp_transports import SimulatedRanks  # noqa: E402
from torch_cp_reference import run_packed, whole, whole_packed  # noqa: E402


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("scheme", ["ring", "all_gather"])
@pytest.mark.parametrize("causal, balanced, window", [(True, True, None), (True, False, None), (False, False, None),
                                                     (True, True, (300, 0)), (True, False, (700, 0)),
                                                     (False, False, (300, 200)), (False, False, (-1, 700))],
                         ids=["causal_balanced", "causal_contiguous", "full", "window300_balanced",
                              "window700_contiguous", "window300_200", "window_open_700"])
@pytest.mark.parametrize("h_kv", [8, 2], ids=["mha", "gqa"])
def test_simulated_ranks_on_one_gpu_equal_the_whole_sequence(scheme, causal, balanced, window, h_kv):
    # Causal windows of 300 and 700 keys over parts of 512 tokens (chunks of 256 balanced), and
    # two-sided ones, (300, 200) and (open, 700): diagonal windows, band pieces below and above the
    # diagonal (the score modifiers with their offsets) and full ones.
    n, b, s, h_q, d = 4, 2, 2048, 8, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    make = lambda h: (torch.rand(b, s, h, d, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    q, k, v, d_o = make(h_q), make(h_kv), make(h_kv), make(h_q)
    scale = d ** -0.5
    arrange = (lambda x: cp.load_balance(x, n)) if balanced else (lambda x: x)
    restore = (lambda x: cp.unbalance(x, n)) if balanced else (lambda x: x)
    parts = [[p.contiguous() for p in arrange(x).chunk(n, 1)] for x in (q, k, v, d_o)]
    ranks, blocks = SimulatedRanks(n), FusedattnBlocks(scale)
    outs = run_forward(parts[0], parts[1], parts[2], ranks, blocks, causal=causal, balanced=balanced, scheme=scheme,
                       window=window)
    os_ = [o.to(torch.bfloat16) for o, _ in outs]
    grads, _ = run_backward(parts[0], parts[1], parts[2], os_, [st for _, st in outs], parts[3], ranks, blocks,
                            causal=causal, balanced=balanced, scheme=scheme, window=window)
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    ref = whole(*leaves, causal, scale, window=window)
    ref.backward(d_o.float())
    assert rel(restore(torch.cat(os_, 1)), ref) < 1e-2
    for i, leaf in enumerate(leaves):
        assert rel(restore(torch.cat([gr[i] for gr in grads], 1)), leaf.grad) < 1e-2, "dqkv"[i]


@pytest.mark.parametrize("scheme", ["ring", "all_gather"])
@pytest.mark.parametrize("causal, balanced, window", [(True, True, None), (True, False, None), (False, False, None),
                                                      (True, True, (200, 0)), (False, False, (150, 400))],
                         ids=["causal_balanced", "causal_contiguous", "full", "window200_balanced",
                              "window150_400"])
@pytest.mark.parametrize("h_kv", [8, 2], ids=["mha", "gqa"])
def test_packed_sequences_on_one_gpu_equal_each_sequences_own_attention(scheme, causal, balanced, window, h_kv):
    # Four ranks over sequences of 1024, 0, 264 and 2992 tokens (multiples of 8: chunks of 128, 0,
    # 33 and 374 balanced), each piece one ragged call over the sequences' chunks. Under a window
    # the chunk pairs past the diagonal run as the modifier of each sequence's bounds: a causal
    # window of 200 covers the short sequence's neighbouring chunks and cuts the long one's.
    n, lengths, h_q, d = 4, [1024, 0, 264, 2992], 8, 128
    g = torch.Generator(device="cuda").manual_seed(5)
    make = lambda h: (torch.rand(sum(lengths), h, d, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    q, k, v, d_o = make(h_q), make(h_kv), make(h_kv), make(h_q)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    scale = d ** -0.5
    o, grads, _ = run_packed(n, q, k, v, d_o, cu, causal, balanced, scheme, FusedattnBlocks(scale),
                             device="cuda", out_dtype=torch.bfloat16, window=window)
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    ref = whole_packed(*leaves, cu, causal, scale, window=window)
    ref.backward(d_o.float())
    assert rel(o, ref) < 1e-2
    for i, leaf in enumerate(leaves):
        assert rel(grads[i], leaf.grad) < 1e-2, "dqkv"[i]
