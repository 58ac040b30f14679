"""flex_attention's masks lowered by structure, run on the CPU (fusedattn/_tile_schedule.py,
fusedattn/torch/_flex_tiles.py, _flex_run.py): fusedattn.torch.attention and the pieces' own forward
and backward (_flex_pieces.FusedattnPiece) replaced by float64 stand-ins with the same meaning, O,
log-sum-exp and the gradients of q, k, v must equal dense float64 attention with the mask at every
(q_idx, kv_idx), FlexAttention's way for rows that see no key (O 0, log-sum-exp -inf, no gradient).
The masks: prefix-LM, documents (runs, and ids that come back), a sliding window inside documents, a
checkerboard of blocks, random block-sparse BlockMasks (with and without a mask_mod), rows that see
nothing; beside no score_mod, a softcap, and one that reads the positions (moved to each view).
Also: a score function's trace moved to a view means what the function means there."""
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="this PyTorch has no FlexAttention")

from fusedattn import _score_mod as core_score_mod, _score_mod_bias, _tile_schedule  # noqa: E402
from fusedattn.torch import _dense_bias, _flex_run, _flex_tiles, _flex_views, _score_mod  # noqa: E402
from test_torch_flex_roads import Float64Piece, calls, grids, stand_in  # noqa: E402

B, H_Q, H_KV, S, D, BLOCK = 2, 4, 2, 192, 16, 32


def pieces_run():
    """The merged pieces the last calls ran (Float64Piece records them)."""
    return [call["piece"] for call in calls if "piece" in call]


@pytest.fixture(autouse=True)
def float64_pieces(monkeypatch):
    """Both ways of _flex_run in float64, and a cost model that splits wherever the pieces compute
    fewer pairs (calls and merges free, the kernels' tile one pair): these problems are small."""
    monkeypatch.setattr(fa, "attention", stand_in)
    monkeypatch.setattr(_flex_run, "FusedattnPiece", Float64Piece)
    for name, value in (("OVERHEAD_US", 0.0), ("MERGE_US", 0.0), ("MERGE_BYTES", 0.0), ("KERNEL_TILE", 1)):
        monkeypatch.setattr(_tile_schedule, name, value)
    _tile_schedule.schedule.cache_clear()
    calls.clear()
    yield
    _tile_schedule.schedule.cache_clear()


def reference(q, k, v, score_mod, keep):
    """Dense float64 attention with `keep` (bool, broadcast to the scores): rows that keep no key
    give O 0 and log-sum-exp -inf, and pass no gradient."""
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], 1) for x in (k, v))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if score_mod is not None:
        s = score_mod(s, *grids(q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    keep = keep.expand(s.shape)
    seen = keep.any(-1, keepdim=True)
    s = s.masked_fill(~keep, float("-inf")).masked_fill(~seen, 0.0)
    lse = torch.logsumexp(s, -1).masked_fill(~seen[..., 0], float("-inf"))
    return (torch.softmax(s, -1) * seen) @ v, lse


def dense_keep(mask_mod):
    return mask_mod(*grids(B, H_Q, S, S))


doc_runs = torch.tensor([0] * 40 + [1] * 25 + [2] * 63 + [3] * 64)
doc_back = torch.tensor([0] * 40 + [1] * 25 + [0] * 63 + [2] * 64)  # document 0 comes back: not runs
MASKS = {
    "prefix-LM 50": lambda b, h, q, kv: (q >= kv) | (kv < 50),
    "documents (runs)": lambda b, h, q, kv: doc_runs[q] == doc_runs[kv],
    "documents that come back": lambda b, h, q, kv: doc_back[q] == doc_back[kv],
    "documents, causal, come back": lambda b, h, q, kv: (doc_back[q] == doc_back[kv]) & (q >= kv),
    "sliding 48 in documents": lambda b, h, q, kv: (doc_runs[q] == doc_runs[kv]) & (q >= kv) & (q - kv < 48),
    "checkerboard of 64": lambda b, h, q, kv: ((q // 64) + (kv // 64)) % 2 == 0,
    "rows 0-39 see nothing": lambda b, h, q, kv: kv <= q - 40,
    "every fifth row sees nothing": lambda b, h, q, kv: (q >= kv) & (q % 5 != 2),
}
softcap = lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0)  # noqa: E731
relative = lambda s, b, h, q, kv: s - 0.05 * (q - kv).abs()  # noqa: E731  (reads positions)
SCORE_MODS = {"plain": None, "softcap": softcap, "relative": relative}


def inputs():
    q = torch.randn(B, H_Q, S, D, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, H_KV, S, D, dtype=torch.float64, requires_grad=True) for _ in "kv")
    return q, k, v


def check(block_mask, keep, score_mod):
    q, k, v = inputs()
    o, lse = fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True, return_lse=True)
    want_o, want_lse = reference(q, k, v, score_mod, keep)
    assert torch.allclose(o, want_o, atol=1e-10) and torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    assert torch.allclose(lse.double(), want_lse, atol=1e-5)
    d_o = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), d_o)
    want = torch.autograd.grad(want_o, (q, k, v), d_o)
    for name, ours, theirs in zip("qkv", grads, want):
        assert torch.allclose(ours, theirs, atol=1e-9), name


@pytest.mark.parametrize("score", list(SCORE_MODS))
@pytest.mark.parametrize("name", list(MASKS))
def test_each_mask_by_its_pieces_equals_the_dense_mask(name, score):
    mask_mod = MASKS[name]
    block_mask = flex.create_block_mask(mask_mod, None, None, S, S, device="cpu", BLOCK_SIZE=BLOCK)
    check(block_mask, dense_keep(mask_mod), SCORE_MODS[score])
    if name == "documents (runs)" and score != "relative":
        assert calls[-1]["layout"] == "thd"  # packed sequences, not tiles
    elif name == "prefix-LM 50":  # the causal square, and the prefix's rows again over the prefix
        assert [(p.rows, p.keys, p.window) for p in pieces_run()] == [((0, S), (0, S), (-1, 0)),
                                                                     ((0, 50), (0, 50), (-1, -1))]
    elif name == "rows 0-39 see nothing":  # one causal call from row 40 (its corner on the band), zeros above
        assert [(c["window"], c["mask"]) for c in calls] == [((-1, 0), False)] and not pieces_run()
    else:
        assert pieces_run(), "merged pieces"
    if name == "sliding 48 in documents":
        assert {p.mask for p in pieces_run()} == {_tile_schedule.BAND_PIECE, _tile_schedule.CONDITIONS_PIECE}


def test_prefix_lm_beside_learned_terms_runs_as_two_attention_calls():
    """A score_mod with a term that requires grad: the causal square and the prefix's square as
    attention() calls (autograd carries the term's gradient), the prefix's rows over the square's."""
    table = torch.randn(H_Q, dtype=torch.float64, requires_grad=True)
    learned = lambda s, b, h, q, kv: s + table[h]  # noqa: E731
    mask_mod = MASKS["prefix-LM 50"]
    block_mask = flex.create_block_mask(mask_mod, None, None, S, S, device="cpu", BLOCK_SIZE=BLOCK)
    check(block_mask, dense_keep(mask_mod), learned)
    assert [(c["causal"], c["window"], c["mask"]) for c in calls] == [(True, (-1, -1), False),
                                                                      (False, (-1, -1), False)]
    assert not pieces_run()


def random_blocks(seed, with_full):
    """A BlockMask of random partial and full blocks, and its dense mask (its mask_mod inside
    partial blocks, every pair of full ones)."""
    generator = torch.Generator().manual_seed(seed)
    n = S // BLOCK
    kind = torch.randint(0, 3 if with_full else 2, (1, 1, n, n), generator=generator)  # 0 none, 1 partial, 2 full

    def listed(which):
        chosen = kind == which
        order = torch.argsort((~chosen).int(), dim=-1, stable=True).int()
        return chosen.sum(-1).int(), order
    mask_mod = lambda b, h, q, kv: (q * 7 + kv * 3) % 4 != 0  # noqa: E731
    block_mask = flex.BlockMask.from_kv_blocks(*listed(1), *(listed(2) if with_full else (None, None)),
                                               BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(S, S))
    tiles = kind[0, 0].repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return block_mask, (tiles == 2) | ((tiles == 1) & dense_keep(mask_mod))


@pytest.mark.parametrize("seed", range(6))
def test_random_block_sparse_masks(seed):
    block_mask, keep = random_blocks(seed, with_full=True)
    check(block_mask, keep, softcap if seed % 2 else None)


def test_a_block_mask_without_a_mask_mod_keeps_its_blocks_whole():
    generator = torch.Generator().manual_seed(7)
    n = S // BLOCK
    chosen = torch.rand(1, 1, n, n, generator=generator) < 0.4
    order = torch.argsort((~chosen).int(), dim=-1, stable=True).int()
    block_mask = flex.BlockMask.from_kv_blocks(chosen.sum(-1).int(), order, BLOCK_SIZE=BLOCK, seq_lengths=(S, S))
    keep = chosen[0, 0].repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    check(block_mask, keep, None)
    assert {p.mask for p in pieces_run()} <= {_tile_schedule.FULL_PIECE}


def test_one_masked_call_over_the_square_gives_rows_without_a_key_zero(monkeypatch):
    # The cost model's own choice for this small problem: the square, as one piece of the merged way.
    monkeypatch.undo()
    monkeypatch.setattr(fa, "attention", stand_in)
    monkeypatch.setattr(_flex_run, "FusedattnPiece", Float64Piece)
    _tile_schedule.schedule.cache_clear()
    mask_mod = MASKS["every fifth row sees nothing"]
    check(flex.create_block_mask(mask_mod, None, None, S, S, device="cpu", BLOCK_SIZE=BLOCK), dense_keep(mask_mod),
          softcap)
    assert pieces_run() == [_tile_schedule.Piece((0, S), (0, S), _tile_schedule.CONDITIONS_PIECE)]


def test_a_trace_moved_to_a_view_means_the_function_there():
    doc = torch.tensor([0] * 5 + [1] * 7 + [2] * 4)
    mask = lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv) & (q - kv < 6)  # noqa: E731
    rows, keys = (3, 14), (2, 16)
    moved = _score_mod.traced(_flex_views.shifted(_score_mod.masked(relative, mask), rows, keys)).traced
    assert "add(q,$" in moved.text and "add(kv,$" in moved.text and "t0[q]" in moved.text
    assert [tuple(t.shape) for t in moved.tensors] == [(11,), (14,)]  # the table cut to the rows and keys
    # The modifier with the score taken as 0: 0 where the mask keeps a pair, -inf elsewhere, plus
    # the relative term: what the function gives at the whole problem's positions.
    at_zero = core_score_mod.Traced(moved.text.replace("score", "0"), moved.scalars, moved.tensors, moved.axes)
    sizes = (1, 1, rows[1] - rows[0], keys[1] - keys[0])
    grid = {name: torch.arange(n).view(*([1] * axis), n, *([1] * (3 - axis)))
            for axis, (name, n) in enumerate(zip(("b", "h", "q", "kv"), sizes))}
    got = _score_mod_bias.evaluate_dense(at_zero, grid, _dense_bias._operations(torch.device("cpu"), sizes))
    i, j = torch.arange(*rows).view(-1, 1), torch.arange(*keys).view(1, -1)
    want = torch.where(mask(0, 0, i, j), relative(torch.zeros(()), 0, 0, i, j), float("-inf"))
    assert torch.allclose(got[0, 0].double(), want.double())
    assert _score_mod.traced(_flex_views.shifted(softcap, (0, 8), (0, 8))).traced.text == \
        _score_mod.traced(softcap).traced.text  # a view at the origin: the same expression


def test_the_tiles_of_a_block_mask_are_what_its_mask_mod_says():
    mask_mod = MASKS["sliding 48 in documents"]
    block_mask = flex.create_block_mask(mask_mod, None, None, S, S, device="cpu", BLOCK_SIZE=BLOCK)
    tiles = _flex_tiles.block_tiles(block_mask, mask_mod, S, S)
    keep = dense_keep(mask_mod)[0, 0]
    for a, (r0, r1) in enumerate(zip(tiles.rows, tiles.rows[1:])):
        for b, (c0, c1) in enumerate(zip(tiles.cols, tiles.cols[1:])):
            part = keep[r0:r1, c0:c1]
            kind = 0 if not part.any() else 1 if part.all() else 2
            assert tiles.kinds[a][b] == kind, (a, b)
            if tiles.bands[a][b] is not None:  # exactly its band
                lo, hi = tiles.bands[a][b]
                d = torch.arange(c0, c1).view(1, -1) - torch.arange(r0, r1).view(-1, 1)
                assert torch.equal(part, (d >= lo) & (d <= hi)), (a, b)
    assert any(band is not None for row in tiles.bands for band in row)
    assert _flex_tiles.block_tiles(block_mask, mask_mod, S, S) is tiles  # kept per BlockMask


def test_merged_pieces_run_on_meta_tensors_forward_and_backward(monkeypatch):
    # fusedattn's own pieces (not the stand-in), through the registered operators' shapes.
    monkeypatch.undo()
    monkeypatch.setattr(_tile_schedule, "OVERHEAD_US", 0.0)
    _tile_schedule.schedule.cache_clear()
    mask_mod = MASKS["checkerboard of 64"]
    block_mask = flex.create_block_mask(mask_mod, None, None, 512, 512, device="cpu")
    q = torch.empty(1, 4, 512, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    o, lse = fa.flex_attention(q, q, q, score_mod=relative, block_mask=block_mask, return_lse=True)
    assert o.shape == q.shape and lse.shape == (1, 4, 512)
    o.sum().backward()
    assert q.grad.shape == q.shape
