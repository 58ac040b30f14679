"""fusedattn.torch.flex_attention on the GPU against float32 attention with the same mask as a
dense bias, outputs, log-sum-exp and gradients: document masks as packed sequences (eager) and as
conditions (compiled), prefix-LM and sliding-window masks from a BlockMask, a softcap beside them."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="this PyTorch has no FlexAttention")
from torch_reference import reference, rel  # noqa: E402

TOLERANCE = 1e-2


def documents(length, count, generator):
    cuts = torch.sort(torch.randperm(length - 1, generator=generator)[:count - 1] + 1).values
    ids = torch.zeros(length, dtype=torch.int64)
    ids[cuts] = 1
    return ids.cumsum(0).cuda()


def check(mask_mod, score_mod=None, *, b=2, h_q=8, h_kv=2, s=1024, compiled=False):
    q = (torch.rand(b, h_q, s, 64, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
    k, v = ((torch.rand(b, h_kv, s, 64, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_() for _ in "kv")
    block_mask = flex.create_block_mask(mask_mod, None, None, s, s, device="cuda")
    call = lambda q, k, v: fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,  # noqa: E731
                                             enable_gqa=True, return_lse=True)
    o, lse = (torch.compile(call, fullgraph=True) if compiled else call)(q, k, v)
    i, j = torch.arange(s, device="cuda").view(s, 1), torch.arange(s, device="cuda").view(1, s)
    keep = mask_mod(0, 0, i, j)
    bias = torch.zeros(s, s, device="cuda").masked_fill(~keep, float("-inf"))
    ref, (qr, kr, vr) = reference(q, k, v, "bhsd", bias=bias)
    assert rel(o, ref) < TOLERANCE
    scores = (qr.detach() @ kr.detach().repeat_interleave(h_q // h_kv, 1).transpose(-1, -2)) / 8.0 + bias
    assert rel(lse, torch.logsumexp(scores, -1)) < 1e-3
    d_o = torch.rand_like(o) * 2 - 1
    o.backward(d_o)
    ref.backward(d_o.float())
    for name, ours, theirs in (("dq", q, qr), ("dk", k, kr), ("dv", v, vr)):
        assert rel(ours.grad, theirs.grad) < TOLERANCE, name


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("count", [8, 32])
@pytest.mark.parametrize("compiled", [False, True], ids=["packed", "conditions"])
def test_document_masks(causal, count, compiled):
    doc = documents(1024, count, torch.Generator().manual_seed(count))
    mask = (lambda b, h, q_idx, kv_idx: (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)) if causal else \
        (lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx])
    check(mask, compiled=compiled)


def test_prefix_lm_with_a_softcap():
    check(lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) | (kv_idx < 256),
          lambda score, b, h, q_idx, kv_idx: 30.0 * torch.tanh(score / 30.0))


def test_a_sliding_window():
    check(lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < 256))
