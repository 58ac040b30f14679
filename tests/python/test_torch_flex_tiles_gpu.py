"""flex_attention's masks lowered by structure on the GPU (fusedattn/_tile_schedule.py): O, the
log-sum-exp and the gradients of q, k, v in BF16 against float32 attention with the mask as a dense
boolean (rows that see no key: O 0, log-sum-exp -inf, as FlexAttention gives), under the cost
model's own choice and with the pieces forced (calls and merges free in the model) so that the
merged pieces, cuDNN's band on views and the conditions over views all run; and beside compiled
FlexAttention on the same tensors. Lengths that are not multiples of the blocks."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="this PyTorch has no FlexAttention")
from fusedattn import _tile_schedule  # noqa: E402
from fusedattn.torch import _flex_run  # noqa: E402
from torch_reference import rel  # noqa: E402

TOLERANCE = 1e-2
B, H_Q, H_KV, S, D = 2, 8, 2, 1000, 64


def documents_that_come_back(length):
    ids = torch.zeros(length, dtype=torch.int64)
    for start, doc in ((0, 0), (230, 1), (410, 0), (700, 2), (880, 3)):
        ids[start:] = doc
    return ids.cuda()


doc = documents_that_come_back(S)
MASKS = {
    "prefix-LM 200": lambda b, h, q, kv: (q >= kv) | (kv < 200),
    "documents that come back": lambda b, h, q, kv: doc[q] == doc[kv],
    "documents, causal, come back": lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv),
    "sliding 256 in documents": lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv) & (q - kv < 256),
    "checkerboard of 256": lambda b, h, q, kv: ((q // 256) + (kv // 256)) % 2 == 0,
    "rows 0-99 see nothing": lambda b, h, q, kv: kv <= q - 100,
    "every fifth row sees nothing": lambda b, h, q, kv: (q >= kv) & (q % 5 != 2),
}
softcap = lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0)  # noqa: E731


def reference(q, k, v, keep, score_mod):
    """float32 attention with the dense mask `keep` [s_q, s_kv]; rows without a key O 0, lse -inf."""
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    ke, ve = (x.repeat_interleave(H_Q // H_KV, 1) for x in (kf, vf))
    s = qf @ ke.transpose(-1, -2) / D ** 0.5
    if score_mod is not None:
        s = score_mod(s, None, None, None, None)
    seen = keep.any(-1, keepdim=True)
    s = s.masked_fill(~keep, float("-inf")).masked_fill(~seen, 0.0)
    lse = torch.logsumexp(s, -1).masked_fill(~seen[..., 0], float("-inf"))
    return (torch.softmax(s, -1) * seen) @ ve, lse, (qf, kf, vf)


def check(name, score_mod=None):
    mask_mod = MASKS[name]
    q = (torch.rand(B, H_Q, S, D, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
    k, v = ((torch.rand(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_() for _ in "kv")
    block_mask = flex.create_block_mask(mask_mod, None, None, S, S, device="cuda")
    o, lse = fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True, return_lse=True)
    i, j = torch.arange(S, device="cuda").view(S, 1), torch.arange(S, device="cuda").view(1, S)
    keep = mask_mod(0, 0, i, j)
    ref, ref_lse, leaves = reference(q, k, v, keep, score_mod)
    seen = torch.isfinite(ref_lse)
    assert rel(o, ref) < TOLERANCE, name
    assert torch.equal(torch.isfinite(lse), seen), "rows without a key: -inf, and only they"
    assert rel(lse[seen], ref_lse[seen]) < 1e-3
    assert bool((o[~seen] == 0).all()), "rows without a key: O 0"
    d_o = torch.rand_like(o) * 2 - 1
    o.backward(d_o)
    ref.backward(d_o.float())
    for which, ours, theirs in zip(("dq", "dk", "dv"), (q, k, v), leaves):
        assert torch.isfinite(ours.grad).all() and rel(ours.grad, theirs.grad) < TOLERANCE, (name, which)
    return o


@pytest.mark.parametrize("name", list(MASKS))
def test_the_cost_models_choice(name):
    check(name)


@pytest.fixture
def pieces_forced(monkeypatch):
    for constant in ("OVERHEAD_US", "MERGE_US", "MERGE_BYTES"):
        monkeypatch.setattr(_tile_schedule, constant, 0.0)
    _tile_schedule.schedule.cache_clear()
    ran = []
    real = _flex_run.FusedattnPiece

    class Counted(real):
        def __init__(self, piece, fn, scale):
            ran.append(piece)
            super().__init__(piece, fn, scale)
    monkeypatch.setattr(_flex_run, "FusedattnPiece", Counted)
    yield ran
    _tile_schedule.schedule.cache_clear()


@pytest.mark.parametrize("score_mod", [None, softcap], ids=["plain", "softcap"])
@pytest.mark.parametrize("name", [n for n in MASKS if n != "prefix-LM 200"])
def test_the_pieces_forced(pieces_forced, name, score_mod):
    check(name, score_mod)
    if name != "rows 0-99 see nothing":  # (that one is a band over rows apart: attention() calls)
        assert len(pieces_forced) > 1, "merged pieces ran"


@pytest.mark.parametrize("name", ["sliding 256 in documents", "rows 0-99 see nothing", "checkerboard of 256"])
def test_beside_compiled_flex_attention(name):
    mask_mod = MASKS[name]
    q = torch.rand(B, H_Q, S, D, device="cuda", dtype=torch.bfloat16) * 2 - 1
    k, v = (torch.rand(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16) * 2 - 1 for _ in "kv")
    block_mask = flex.create_block_mask(mask_mod, None, None, S, S, device="cuda")
    theirs, their_lse = torch.compile(flex.flex_attention)(q, k, v, block_mask=block_mask, enable_gqa=True,
                                                           return_lse=True)
    ours, our_lse = fa.flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True, return_lse=True)
    assert rel(ours, theirs) < TOLERANCE
    seen = torch.isfinite(their_lse)
    assert torch.equal(torch.isfinite(our_lse), seen)
    assert rel(our_lse[seen], their_lse[seen]) < 1e-3
