"""fusedattn.torch.flex_attention without a GPU: FlexAttention's signature on meta tensors (O and the
log-sum-exp), a BlockMask's mask_mod traced beside score_mod into the core's expression (its
numbers runtime scalars, retraced when a closure's number changes), grouped heads only with
enable_gqa, lengths checked against the BlockMask's, and torch.compile in one graph."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="this PyTorch has no FlexAttention")

from fusedattn import InvalidArgumentError  # noqa: E402
from fusedattn.torch._score_mod import masked, traced  # noqa: E402


def bhsd(b, h, s, d=64):
    return torch.empty(b, h, s, d, device="meta", dtype=torch.bfloat16)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding(window):
    return lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < window)


def prefix_lm(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) | (kv_idx < 256)


def softcap(score, b, h, q_idx, kv_idx):
    return 30.0 * torch.tanh(score / 30.0)


def test_masks_trace_beside_the_score_mod():
    assert traced(masked(None, causal)).traced.text == "select(ge(q,kv),score,-inf)"
    entry = traced(masked(softcap, prefix_lm)).traced  # the modifier's slots first, then the mask's
    assert entry.text == "select(or(ge(q,kv),lt(kv,$1)),mul($0,tanh(div(score,$0))),-inf)"
    assert entry.scalars == (30.0, 256.0)
    assert masked(softcap, prefix_lm) is masked(softcap, prefix_lm)  # one object a pair: traced once


def test_a_closure_number_of_the_mask_retraces_with_the_same_structure():
    window = 128
    fn = lambda b, h, q_idx, kv_idx: q_idx - kv_idx < window  # noqa: E731
    first = traced(masked(None, fn)).traced
    window = 64
    second = traced(masked(None, fn)).traced
    assert first.text == second.text and (first.scalars, second.scalars) == ((128.0,), (64.0,))


@pytest.mark.parametrize("mask_mod", [causal, sliding(128), prefix_lm, None])
def test_flex_attention_gives_o_and_the_log_sum_exp(mask_mod):
    q, k = bhsd(2, 8, 512), bhsd(2, 8, 640)
    block_mask = None if mask_mod is None else flex.create_block_mask(mask_mod, None, None, 512, 640, device="cpu")
    o = fa.flex_attention(q, k, k, score_mod=softcap, block_mask=block_mask)
    assert o.shape == (2, 8, 512, 64) and o.dtype == torch.bfloat16
    o, lse = fa.flex_attention(q, k, k, block_mask=block_mask, return_lse=True, kernel_options={"BLOCK_M": 64})
    assert o.shape == (2, 8, 512, 64) and lse.shape == (2, 8, 512) and lse.dtype == torch.float32


def test_a_gathered_term_of_the_score_mod_stays_a_bias_under_the_mask():
    # The score_mod and the mask are traced apart: a relative-position table's term stays the call's
    # bias (added after the mask, which keeps a dropped key at -inf), where one function would put it
    # inside the select and be refused.
    table = torch.randn(8, 65)
    relative = lambda s, b, h, q_idx, kv_idx: s + table[h, (kv_idx - q_idx).clamp(-32, 32) + 32]  # noqa: E731
    entry = traced(masked(relative, prefix_lm)).traced
    assert entry.text == "select(or(ge(q,kv),lt(kv,256.0)),score,-inf)"  # numbers written beside a bias
    assert entry.bias.text.startswith("G0(h,") and entry.bias.tensors[0] is table
    q = bhsd(1, 8, 512)
    assert fa.attention(q, q, q, layout="bhsd", score_mod=relative, mask_mod=prefix_lm).shape == q.shape


def test_a_block_mask_without_a_mask_keeps_every_key():
    q = bhsd(1, 4, 256)
    block_mask = flex.create_block_mask(flex.noop_mask, None, None, 256, 256, device="cpu")
    assert fa.flex_attention(q, q, q, block_mask=block_mask).shape == q.shape


def test_grouped_heads_need_enable_gqa_and_lengths_must_match_the_block_mask():
    q, k = bhsd(1, 8, 256), bhsd(1, 2, 256)
    with pytest.raises(InvalidArgumentError) as caught:
        fa.flex_attention(q, k, k)
    assert caught.value.field == "key.shape" and "enable_gqa=True" in str(caught.value)
    assert fa.flex_attention(q, k, k, enable_gqa=True).shape == q.shape
    block_mask = flex.create_block_mask(causal, None, None, 128, 128, device="cpu")
    with pytest.raises(InvalidArgumentError) as caught:
        fa.flex_attention(q, q, q, block_mask=block_mask)
    assert caught.value.field == "block_mask.seq_lengths"


def test_flex_attention_compiles_in_one_graph():
    block_mask = flex.create_block_mask(prefix_lm, None, None, 512, 512, device="cpu")
    step = torch.compile(lambda q, k, v: fa.flex_attention(q, k, v, score_mod=softcap, block_mask=block_mask),
                         fullgraph=True, backend="eager")
    q = bhsd(2, 8, 512)
    assert step(q, q, q).shape == q.shape


def test_a_tensor_the_mask_reads_is_fetched_in_compiled_code():
    # Heads that see everything (a per-head table the mask reads at h) beside a per-head table in the
    # score_mod: each tensor fetched from the function that holds it, in one graph.
    bidirectional = torch.tensor([1.0, 0, 0, 0, 1, 0, 0, 0])
    bias_table = torch.rand(8)

    def causal_unless_bidirectional(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) | (bidirectional[h] > 0)

    def with_table(score, b, h, q_idx, kv_idx):
        return score + bias_table[h]
    entry = traced(masked(with_table, causal_unless_bidirectional)).traced
    assert entry.text == "select(or(ge(q,kv),gt(t1[h],0)),add(score,t0[h]),-inf)"
    block_mask = flex.create_block_mask(causal_unless_bidirectional, None, 8, 512, 512, device="cpu")
    step = torch.compile(lambda q: fa.flex_attention(q, q, q, score_mod=with_table, block_mask=block_mask),
                         fullgraph=True, backend="eager")
    q = bhsd(2, 8, 512)
    assert step(q).shape == q.shape


def test_document_masks_over_runs_become_packed_sequences():
    from fusedattn.torch import _documents
    doc = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    q = torch.zeros(2, 4, 8, 64)
    same_document = lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx]  # noqa: E731
    docs = _documents.documents(same_document, None, q, q)
    assert docs.cu_seqlens.tolist() == [0, 3, 5, 8, 11, 13, 16] and docs.longest == 3 and not docs.causal
    causal_documents = lambda b, h, q_idx, kv_idx: (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)  # noqa: E731
    assert _documents.documents(causal_documents, softcap, q, q).causal  # a softcap reads no index
    relative = lambda s, b, h, q_idx, kv_idx: s - 0.1 * (q_idx - kv_idx)  # noqa: E731
    assert _documents.documents(same_document, relative, q, q) is None  # packed indices would differ
    back = torch.tensor([0, 0, 1, 1, 0, 0, 2, 2])  # document 0 comes back: not runs
    assert _documents.documents(lambda b, h, q_idx, kv_idx: back[q_idx] == back[kv_idx], None, q, q) is None
    assert _documents.documents(causal, None, q, q) is None


def test_document_runs_are_found_once_per_ids_tensor_and_again_after_it_changes():
    from fusedattn.torch import _documents
    doc = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    q = torch.zeros(1, 4, 8, 64)
    same_document = lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx]  # noqa: E731
    first = _documents.documents(same_document, None, q, q)
    assert _documents.documents(same_document, None, q, q) is first  # every layer's call: no new reads
    doc[3:] = torch.tensor([1, 1, 1, 1, 1])  # in place: the runs are found again
    assert _documents.documents(same_document, None, q, q).cu_seqlens.tolist() == [0, 3, 8]
    other = doc.clone()  # equal values, another tensor: its own entry
    assert _documents.documents(lambda b, h, q_idx, kv_idx: other[q_idx] == other[kv_idx], None, q, q) is not first


@pytest.mark.parametrize("batch", [1, 2])
def test_packed_tokens_go_back_to_their_places(batch):
    from fusedattn.torch import _documents
    x = torch.randn(batch, 4, 8, 16)
    packed = _documents.pack(x)
    assert packed.shape == (batch * 8, 4, 16)
    assert torch.equal(_documents.unpack(packed, batch, 8), x)
    stats = torch.randn(batch * 8, 4)
    assert _documents.unpack(stats, batch, 8).shape == (batch, 4, 8)


def test_masks_that_are_cudnns_own_run_as_its_band_or_as_two_calls():
    from fusedattn._mask_structure import Band, Prefix, structure
    from fusedattn.torch._score_mod import mask_structure
    assert mask_structure(causal) == ("band", -1)
    assert mask_structure(sliding(128)) == ("band", 128)
    assert mask_structure(lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx) & (q_idx - kv_idx <= 64)) == ("band", 65)
    assert mask_structure(prefix_lm) == ("prefix", 256)
    assert mask_structure(lambda b, h, q_idx, kv_idx: (kv_idx < 100) | (q_idx >= kv_idx)) == ("prefix", 100)
    assert mask_structure(lambda b, h, q_idx, kv_idx: q_idx - kv_idx < 128) is None  # no causal side
    # The texts as traced, worked by hand.
    assert structure("select(and(gt(kv,sub(q,$0)),ge(q,kv)),score,-inf)", (32.0,)) == Band(32)
    assert structure("select(or(ge(q,kv),gt($0,kv)),score,-inf)", (7.0,)) == Prefix(7)
    assert structure("select(or(ge(q,kv),lt(kv,$0)),score,-inf)", (0.5,)) is None  # not a whole length
    assert structure("select(ge(q,kv),mul(score,2),-inf)", ()) is None  # a modifier is not a mask


def test_prefix_lm_runs_as_the_causal_square_with_the_prefix_again(monkeypatch):
    """The causal square and the prefix's square, both from position 0 (checked in float64 by
    test_torch_flex_tiles.py): eager as the two pieces of _flex_run._PrefixOverCausal, compiled (in
    one graph, with a score_mod as without) as two attention() calls."""
    from fusedattn.torch import _flex_run
    taken = []
    real = _flex_run._PrefixOverCausal.apply
    monkeypatch.setattr(_flex_run._PrefixOverCausal, "apply", lambda *args: taken.append(args[-1]) or real(*args))
    q = bhsd(2, 16, 2048).requires_grad_()
    block_mask = flex.create_block_mask(prefix_lm, None, None, 2048, 2048, device="cpu")
    o, lse = fa.flex_attention(q, q, q, score_mod=softcap, block_mask=block_mask, return_lse=True)
    assert o.shape == q.shape and lse.shape == (2, 16, 2048) and taken == [256]
    o.sum().backward()
    assert q.grad.shape == q.shape

    def configs(score_mod, backend):
        """The configs of the fusedattn calls in the graph that compiled code captures."""
        graphs = []

        def recorded(gm, inputs):  # the graph's code and its submodules' (an autograd.Function's bodies)
            graphs.append("".join(module.code for module in gm.modules() if hasattr(module, "code")))
            return (torch._dynamo.backends.debugging.aot_eager if backend == "aot_eager" else
                    lambda gm, inputs: gm.forward)(gm, inputs)
        torch._dynamo.reset()
        step = torch.compile(lambda q: fa.flex_attention(q, q, q, score_mod=score_mod, block_mask=block_mask),
                             fullgraph=True, backend=recorded)
        x = bhsd(2, 16, 2048).requires_grad_()
        step(x).sum().backward()
        assert x.grad.shape == x.shape
        return [part.split("'")[1] for part in graphs[0].split("torch.ops.fusedattn.forward.default(")[1:]]
    for backend in ("eager", "aot_eager"):
        assert configs(None, backend) == ["layout=bhsd window=-1,0", "layout=bhsd"]
    capped = configs(softcap, "eager")
    assert len(capped) == 2 and capped[0].startswith("layout=bhsd window=-1,0 ") and "score_mod=" in capped[1], capped
