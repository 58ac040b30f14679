"""fusedattn.torch.flex_attention on the GPU against float32 attention with the same score_mod and
mask, outputs, log-sum-exp and gradients: document masks as packed sequences (eager, a score_mod
beside them too) and as conditions (compiled), prefix-LM and sliding-window masks from a BlockMask,
a softcap beside them."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="this PyTorch has no FlexAttention")
from torch_reference import rel  # noqa: E402

TOLERANCE = 1e-2


def documents(length, count, generator):
    cuts = torch.sort(torch.randperm(length - 1, generator=generator)[:count - 1] + 1).values
    ids = torch.zeros(length, dtype=torch.int64)
    ids[cuts] = 1
    return ids.cumsum(0).cuda()


def flex_reference(q, k, v, score_mod, keep):
    """float32 attention with score_mod on the scaled scores and then the mask (keep [s_q, s_kv]), as
    FlexAttention defines it: O, the log-sum-exp and the float32 leaves."""
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    qr, kr, vr = leaves
    group = qr.shape[1] // kr.shape[1]
    kr, vr = kr.repeat_interleave(group, 1), vr.repeat_interleave(group, 1)
    scores = qr @ kr.transpose(-1, -2) / qr.shape[-1] ** 0.5
    if score_mod is not None:
        grid = [torch.arange(n, device=q.device).view(*([1] * a), n, *([1] * (3 - a)))
                for a, n in enumerate(scores.shape)]
        scores = score_mod(scores, *grid)
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1) @ vr, torch.logsumexp(scores.detach(), -1), leaves


def bhsd(b, h, s, strided):
    """A leaf [b, h, s, 64] of BF16 values in [-1, 1): dense, or (strided) a [b, s, h, 64] tensor's view."""
    x = torch.rand(b, s, h, 64, device="cuda").transpose(1, 2) if strided else torch.rand(b, h, s, 64, device="cuda")
    return (x.to(torch.bfloat16) * 2 - 1).requires_grad_()


def check(mask_mod, score_mod=None, *, b=2, h_q=8, h_kv=2, s=1024, compiled=False, strided=False):
    q, k, v = bhsd(b, h_q, s, strided), bhsd(b, h_kv, s, strided), bhsd(b, h_kv, s, strided)
    block_mask = flex.create_block_mask(mask_mod, None, None, s, s, device="cuda")
    call = lambda q, k, v: fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,  # noqa: E731
                                             enable_gqa=True, return_lse=True)
    o, lse = (torch.compile(call, fullgraph=True) if compiled else call)(q, k, v)
    i, j = torch.arange(s, device="cuda").view(s, 1), torch.arange(s, device="cuda").view(1, s)
    ref, ref_lse, (qr, kr, vr) = flex_reference(q, k, v, score_mod, mask_mod(0, 0, i, j))
    assert rel(o, ref) < TOLERANCE
    assert rel(lse, ref_lse) < 1e-3
    d_o = torch.rand_like(o) * 2 - 1
    o.backward(d_o)
    ref.backward(d_o.float())
    for name, ours, theirs in (("dq", q, qr), ("dk", k, kr), ("dv", v, vr)):
        assert rel(ours.grad, theirs.grad) < TOLERANCE, name


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("count", [8, 32])
@pytest.mark.parametrize("compiled", [False, True], ids=["packed", "conditions"])
@pytest.mark.parametrize("b", [1, 2])
def test_document_masks(causal, count, compiled, b):
    # b = 1 packs as a view of the bhsd tensors (a token's heads s * d apart, which cuDNN's ragged
    # tensors then read and write in place); b = 2 as a copy in token order.
    doc = documents(1024, count, torch.Generator().manual_seed(count))
    mask = (lambda b, h, q_idx, kv_idx: (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)) if causal else \
        (lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx])
    check(mask, b=b, compiled=compiled)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("score_mod", ["identity", "softcap"])
def test_document_masks_beside_a_score_mod(causal, score_mod):
    # Packed sequences with the score_mod in cuDNN's score graph (an identity is no modifier): 20
    # documents of 100 tokens and one of 124 a row, as FlexAttention's users cut them.
    doc = (torch.arange(1024, device="cuda") // 100).clamp(max=9)
    mask = (lambda b, h, q_idx, kv_idx: (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)) if causal else \
        (lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx])
    mod = (lambda score, b, h, q_idx, kv_idx: score) if score_mod == "identity" else \
        (lambda score, b, h, q_idx, kv_idx: 2.0 * torch.tanh(score / 2.0))  # a cap that bends the scores
    check(mask, mod, h_kv=8)


@pytest.mark.parametrize("strided", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize("road", ["C++", "Python"])
def test_prefix_lm_with_a_softcap(road, strided, monkeypatch):
    # Both roads of _flex_run._PrefixOverCausal: the C++ path's prefix_forward and prefix_backward
    # (the prefix's call reading and writing the whole tensors' rows), and the pieces composed in
    # Python; over dense tensors and over views of [b, s, h, d] ones (dQ then has q's strides).
    from fusedattn.torch import _flex_pieces, _flex_run
    pieces_ran = []
    real = _flex_pieces.FusedattnPiece.forward
    monkeypatch.setattr(_flex_pieces.FusedattnPiece, "forward", lambda *a: pieces_ran.append(1) or real(*a))
    if road == "Python":
        monkeypatch.setattr(_flex_run, "_fast_prefix", lambda *args: None)
    check(lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) | (kv_idx < 256),
          lambda score, b, h, q_idx, kv_idx: 30.0 * torch.tanh(score / 30.0), strided=strided)
    assert bool(pieces_ran) == (road == "Python"), "the road asked for ran"


def test_a_sliding_window():
    check(lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < 256))
