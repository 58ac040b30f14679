"""fusedattn.torch.flex_attention's roads on the CPU: causal and sliding-window masks as the call's
window, prefix-LM as two calls over the rows, document masks as packed sequences, and the rest as
conditions, each with fusedattn.torch.attention replaced by a float64 stand-in that takes the same
arguments (layouts, windows, alignment, packed sequences, score_mod, mask_mod, statistics), and the
pieces of schedules merged by log-sum-exp by another (Float64Piece; test_torch_flex_tiles.py). Every
road's O and log-sum-exp must equal attention of the whole problem with the mask evaluated at
every (q_idx, kv_idx): what the roads take apart, they put back together exactly."""
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="this PyTorch has no FlexAttention")


def grids(b, h, s_q, s_kv):
    return [torch.arange(n).view(*([1] * axis), n, *([1] * (3 - axis))) for axis, n in enumerate((b, h, s_q, s_kv))]


def dense(q, k, v, scale, score_mod=None, keep=None):
    """float64 attention of bhsd q, k, v (grouped heads expanded) and its log-sum-exp; `keep` a bool
    mask broadcasting to the scores."""
    b, h, s_q, d = q.shape
    k, v = (x.double().repeat_interleave(h // x.shape[1], 1) for x in (k, v))
    scores = (q.double() @ k.transpose(-1, -2)) * scale
    if score_mod is not None:
        scores = score_mod(scores, *grids(b, h, s_q, k.shape[2]))
    if keep is not None:
        scores = scores.masked_fill(~keep.expand(scores.shape), float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def band(s_q, s_kv, causal, align, window):
    left, right = window
    right = 0 if causal else right
    i, j = torch.arange(s_q).view(s_q, 1), torch.arange(s_kv).view(1, s_kv)
    p = i + (s_kv - s_q if align == "bottom_right" else 0)
    keep = torch.ones(s_q, s_kv, dtype=torch.bool)
    if left >= 0:
        keep &= j > p - left
    if right >= 0:
        keep &= j <= p + right
    return keep


calls = []
real_attention = fa.attention


def stand_in(q, k, v, *, layout, causal=False, align="top_left", window=(-1, -1), scale=None, score_mod=None,
             mask_mod=None, return_stats=False, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=0,
             max_seqlen_kv=0):
    """fusedattn.torch.attention's meaning, in float64 on the CPU, for the arguments flex_attention passes."""
    calls.append(dict(layout=layout, causal=causal, align=align, window=tuple(window), mask=mask_mod is not None))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if layout == "thd":
        outs, stats = [], []
        cu = cu_seqlens_q.tolist()
        for start, end in zip(cu, cu[1:]):  # each sequence alone, its own indices from 0
            piece = [x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v)]
            keep = band(end - start, end - start, causal, align, window)
            o, lse = dense(*piece, scale, score_mod, keep)
            outs.append(o[0].transpose(0, 1))
            stats.append(lse[0].transpose(0, 1))
        o, lse = torch.cat(outs).to(q.dtype), torch.cat(stats).float()
    else:
        b, h, s_q, _ = q.shape
        keep = band(s_q, k.shape[2], causal, align, window)
        if mask_mod is not None:
            keep = keep & mask_mod(*grids(b, h, s_q, k.shape[2]))
        o, lse = dense(q, k, v, scale, score_mod, keep)
        o, lse = o.to(q.dtype), lse.float()
    return (o, lse) if return_stats else o


class Float64Piece:
    """fusedattn.torch._flex_pieces.FusedattnPiece's meaning in float64 (a piece of a schedule whose
    pieces share rows, merged by log-sum-exp): the piece's window on its view, its score function (a
    Shifted one is called with the view's indices), and a backward from the O and statistics of the
    whole rows: the gradient of sum P * (dO v^T - D) with P = exp(s - L) for fixed L and D, which is
    each pair's dS = P (dP - D) and dV = P^T dO."""

    def __init__(self, piece, fn, scale):
        self.piece, self.fn, self.scale = piece, fn, scale
        calls.append(dict(layout="bhsd", causal=False, align=piece.align, window=piece.window,
                          mask=piece.mask == "conditions", piece=piece))

    def fast_call(self, q, k, v):
        return None  # no C++ path: prefix-LM's pieces are composed in Python (_flex_run._PrefixOverCausal)

    def scores(self, q, k):
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        s = (q @ k.transpose(-1, -2)) * self.scale
        if self.fn is not None:
            s = self.fn(s, *grids(q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
        return s.masked_fill(~band(q.shape[2], k.shape[2], False, self.piece.align, self.piece.window), float("-inf"))

    def forward(self, q, k, v):
        s = self.scores(q, k)
        return torch.softmax(s, -1) @ v.repeat_interleave(q.shape[1] // v.shape[1], 1), torch.logsumexp(s, -1)

    def backward(self, d_o, q, k, v, o, stats):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        with torch.enable_grad():
            p = torch.exp(self.scores(q, k) - stats.unsqueeze(-1))
            wide_v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
            d_p = d_o @ wide_v.transpose(-1, -2) - (d_o * o).sum(-1, keepdim=True)
            return torch.autograd.grad((p * d_p).sum(), (q, k, v))


@pytest.fixture(autouse=True)
def float64_attention(monkeypatch):
    from fusedattn.torch import _flex_run
    monkeypatch.setattr(fa, "attention", stand_in)
    monkeypatch.setattr(_flex_run, "FusedattnPiece", Float64Piece)
    calls.clear()


@pytest.fixture
def no_call_overhead(monkeypatch):
    """The cost model without its 10 us a call (fusedattn/_tile_schedule.py): these problems are too
    small for a second call to pay, and without that price the schedule splits wherever it computes
    fewer tiles than one masked call, which is what the roads look at."""
    from fusedattn import _tile_schedule
    monkeypatch.setattr(_tile_schedule, "OVERHEAD_US", 0.0)
    monkeypatch.setattr(_tile_schedule, "MERGE_US", 0.0)
    _tile_schedule.schedule.cache_clear()
    yield
    _tile_schedule.schedule.cache_clear()


doc = torch.tensor([0] * 40 + [1] * 25 + [2] * 63 + [3] * 64)  # 4 documents over 192 tokens
softcap = lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0)  # noqa: E731
MASKS = {
    # attention() itself makes these its window (test_a_band_mask_becomes_the_calls_window)
    "causal": (lambda b, h, q, kv: q >= kv, dict(layout="bhsd", mask=True)),
    "window 48": (lambda b, h, q, kv: (q >= kv) & (q - kv < 48), dict(layout="bhsd", mask=True)),
    "window 48 written <=": (lambda b, h, q, kv: (kv <= q) & (q - kv <= 47), dict(layout="bhsd", mask=True)),
    # the causal square and the prefix again over the prefix (the last piece made: the prefix's)
    "prefix-LM 50": (lambda b, h, q, kv: (q >= kv) | (kv < 50), dict(layout="bhsd", window=(-1, -1))),
    "documents": (lambda b, h, q, kv: doc[q] == doc[kv], dict(layout="thd", causal=False)),
    "documents, causal": (lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv), dict(layout="thd", causal=True)),
    "every third key": (lambda b, h, q, kv: kv % 3 == 0, dict(layout="bhsd", mask=True)),
}


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("score_mod", [None, softcap], ids=["plain", "softcap"])
def test_each_road_puts_the_whole_problem_back_together(no_call_overhead, name, score_mod):
    mask_mod, road = MASKS[name]
    b, h_q, h_kv, s, d = 2, 4, 2, 192, 16
    q = torch.randn(b, h_q, s, d, dtype=torch.float64)
    k, v = (torch.randn(b, h_kv, s, d, dtype=torch.float64) for _ in "kv")
    block_mask = flex.create_block_mask(mask_mod, None, None, s, s, device="cpu")
    o, lse = fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True, return_lse=True)
    want_o, want_lse = dense(q, k, v, d ** -0.5, score_mod, mask_mod(*grids(b, h_q, s, s)))
    assert torch.allclose(o, want_o, atol=1e-10) and torch.allclose(lse.double(), want_lse, atol=1e-5), name
    taken = calls[-1]
    assert all(taken[key] == value for key, value in road.items()), (name, calls)


@pytest.mark.parametrize("name, window", [("causal", "-1,0"), ("window 48", "48,0"), ("window 48 written <=", "48,0")])
def test_a_band_mask_becomes_the_calls_window(monkeypatch, name, window):
    configs = []
    monkeypatch.setattr(fa, "attend", lambda q, k, v, **kw: configs.append(kw["config"]) or (q, None, None))
    q = torch.empty(1, 4, 192, 16, device="meta", dtype=torch.bfloat16)
    real_attention(q, q, q, layout="bhsd", mask_mod=MASKS[name][0], score_mod=softcap)
    assert f"window={window}" in configs[-1] and "select" not in configs[-1], configs
