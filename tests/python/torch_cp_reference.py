"""The PyTorch context-parallel tests' float64 reference: stand-in block kernels (ReferenceBlocks)
that use the O and statistics they are given, as cuDNN's backward does; attention of the whole
sequence (and of each packed sequence alone); the problems; runs of N simulated ranks in one process
(SimulatedRanks, in-process copies); and the answers they must give, outputs and gradients."""
import functools
from typing import NamedTuple, Optional, Tuple

import pytest
import torch

from fusedattn import _context_parallel as _cp
from fusedattn.torch import _context_parallel as cp
from fusedattn.torch._cp_schedule import run_backward, run_forward
from fusedattn.torch._cp_transports import SimulatedRanks

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

# Sequences of 24, 0 (empty), 8 and 48 tokens: multiples of 2N = 8, the chunks of 1 to 6 tokens.
PACKED_LENGTHS = (24, 0, 8, 48)
