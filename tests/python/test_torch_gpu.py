"""fusedattn.torch on a GPU, against float32 math attention (upcast inputs; torch_reference.py) for
outputs and gradients: layouts, alignments and dtypes, packed and ragged batches, bias and sink,
torch.compile, streams, errors and the fallback, dropout, max logit, the plan cache's cap, CUDA
graphs. Paged caches: test_torch_paged_gpu.py; the C++ fast path: test_torch_fast_path_gpu.py."""
import logging

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import fusedattn  # noqa: E402
from torch_blocks import Block  # noqa: E402
from torch_reference import TO_BHSD, inputs, reference, rel  # noqa: E402

TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
@pytest.mark.parametrize("causal, align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_outputs_and_gradients_match_float32(layout, causal, align, dtype):
    q, k, v = inputs(layout, 2, 333, 517, 8, 2, 128, dtype)
    o = fa.attention(q, k, v, layout=layout, causal=causal, align=align)
    d_o = torch.rand_like(o) * 2 - 1
    o.backward(d_o)
    ref, leaves = reference(q, k, v, layout, causal, align)
    ref.backward(d_o.float())
    tolerance = TOLERANCE[dtype]
    assert rel(o, ref) < tolerance
    for ours, theirs in zip((q.grad, k.grad, v.grad), leaves):
        assert rel(ours, theirs.grad.permute(*[TO_BHSD[layout].index(i) for i in range(4)])) < tolerance


def test_packed_qkv_views_and_their_gradients():
    qkv = (torch.rand(2, 300, 3, 4, 64, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
    q, k, v = qkv.unbind(2)
    o = fa.attention(q, k, v, layout="bshd", causal=True)
    o.sum().backward()
    ref, leaves = reference(q, k, v, "bshd", causal=True)
    ref.sum().backward()
    assert rel(o, ref) < 1e-2
    assert rel(qkv.grad[:, :, 0], leaves[0].grad.permute(0, 2, 1, 3)) < 1e-2


def test_ragged_matches_each_sequence_alone():
    lengths = [100, 0, 257, 31]
    h, d = 4, 64
    q = (torch.rand(sum(lengths), h, d, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
    k, v = (torch.rand_like(q) * 2 - 1).requires_grad_(), (torch.rand_like(q) * 2 - 1).requires_grad_()
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda", dtype=torch.int32)
    o = fa.attention(q, k, v, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths),
                     max_seqlen_kv=max(lengths), causal=True)
    start = 0
    for n in lengths:
        if n:
            piece = slice(start, start + n)
            ref, _ = reference(q[piece][None], k[piece][None], v[piece][None], "bshd", causal=True)
            assert rel(o[piece], ref[0]) < 1e-2
        start += n


def test_bias_with_its_gradient_and_a_learnable_sink():
    q, k, v = inputs("bshd", 2, 200, 200, 4, 4, 64)
    bias = (torch.rand(1, 4, 200, 200, device="cuda", dtype=torch.bfloat16) - 0.5).requires_grad_()
    sink = torch.zeros(4, device="cuda", requires_grad=True)
    o = fa.attention(q, k, v, bias=bias, softmax="sink", sink=sink)
    o.sum().backward()
    ref, _ = reference(q, k, v, "bshd", bias=bias, sink=sink)
    assert rel(o, ref) < 1e-2
    assert bias.grad is not None and sink.grad is not None


@pytest.mark.parametrize("d", [64, 96])
def test_a_sink_in_a_decode_step_runs_on_the_kernel_or_joined_after(d):
    # One query row (gpt-oss's decode): d 64 runs on fusedattn's decode kernel, which adds the sink
    # itself; d 96 it does not take, and cuDNN refuses a sink on one row, so the vanilla call is
    # joined with the sink. Sinks of +-3 weigh as much as the 5 keys of the short sequence.
    q, k, v = inputs("bshd", 2, 1, 300, 8, 2, d)
    sink = (torch.rand(8, device="cuda") * 6 - 3)
    with torch.no_grad():
        o, stats = fa.attention(q, k, v, causal=True, align="bottom_right", softmax="sink", sink=sink,
                                return_stats=True)
        short = fa.attention(q, k[:, :5], v[:, :5], causal=True, align="bottom_right", softmax="sink", sink=sink)
    ref, _ = reference(q, k, v, "bshd", True, "bottom_right", sink=sink)
    ref_short, _ = reference(q, k[:, :5], v[:, :5], "bshd", True, "bottom_right", sink=sink)
    assert rel(o, ref) < 1e-2 and rel(short, ref_short) < 1e-2
    spec = f"layout=bshd dtype=bf16 b=2 s_q=1 s_kv=300 h_q=8 h_kv=2 d={d} causal align=bottom_right softmax=sink"
    on_the_kernel = fusedattn.check_support(spec).kernel.startswith("fusedattn decode kernel")
    assert on_the_kernel == (d == 64)
    assert stats.shape == (2, 8, 1) and torch.isfinite(stats).all()


def test_compiled_block_has_no_graph_break_and_matches_eager():
    block = Block().to(device="cuda", dtype=torch.bfloat16)
    x = torch.rand(2, 128, 128, device="cuda", dtype=torch.bfloat16)
    explanation = torch._dynamo.explain(block)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(block, fullgraph=True)
    assert rel(compiled(x), block(x)) < 1e-2


def test_current_stream_is_used():
    q, k, v = inputs("bshd", 1, 128, 128, 4, 4, 64)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = fa.attention(q, k, v)
    side.synchronize()
    ref, _ = reference(q, k, v, "bshd")
    assert rel(out, ref) < 1e-2


def test_unsupported_raises_with_every_reason_or_falls_back_when_asked(caplog):
    q, k, v = inputs("bshd", 1, 64, 64, 2, 2, 512)  # head dim 512: beyond cuDNN's kernels
    with pytest.raises(fusedattn.NotSupportedError) as caught:
        fa.attention(q, k, v)
    assert "d_qk" in str(caught.value)
    with caplog.at_level(logging.WARNING, logger="fusedattn"):
        out = fa.attention(q, k, v, fallback=True)
        fa.attention(q, k, v, fallback=True)
    assert sum("falling back" in r.message for r in caplog.records) == 1
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    assert rel(out, ref) < 1e-2


def test_dropout_replays_with_the_generator_and_the_backward_uses_the_forward_mask():
    q, k, v = inputs("bshd", 2, 300, 300, 4, 4, 64)
    torch.manual_seed(7)
    first = fa.attention(q, k, v, dropout_p=0.2)
    torch.manual_seed(7)
    again = fa.attention(q, k, v, dropout_p=0.2)
    other = fa.attention(q, k, v, dropout_p=0.2)
    assert torch.equal(first, again) and not torch.equal(first, other)
    # O = Pd V is linear in V and dV = Pd^T dO, so sum(dV * V) = sum(O * dO) exactly when the
    # backward drops what the forward dropped; another mask breaks the identity.
    o = fa.attention(q, k, v, dropout_p=0.2)
    d_o = torch.rand_like(o)
    o.backward(d_o)
    lhs, rhs = (v.grad.float() * v.float()).sum(), (o.float() * d_o.float()).sum()
    assert abs(lhs - rhs) / abs(rhs) < 1e-2


def test_max_logit_per_row_and_per_head():
    q, k, v = inputs("bshd", 2, 200, 300, 4, 4, 64)
    with torch.no_grad():
        o, rows = fa.attention(q, k, v, causal=True, return_max_logit="row")
        _, heads = fa.attention(q, k, v, causal=True, return_max_logit="head")
        scores = q.float().transpose(1, 2) @ k.float().transpose(1, 2).transpose(-1, -2) / 8.0
        keep = torch.ones(200, 300, dtype=torch.bool, device="cuda").tril()
        expected = scores.masked_fill(~keep, float("-inf")).amax(-1)
    assert rel(rows, expected) < 1e-3
    assert rel(heads, expected.amax(dim=(0, 2))) < 1e-3


def test_ten_thousand_shapes_keep_the_plans_at_the_cap():
    """fusedattn.torch keeps no plans: with the core's cap at 4, 10,000 calls of distinct q shapes
    (packed sequences of 1 .. 10,000 tokens, then again in a shuffled order) and 24 distinct dense
    shapes never hold more than 4 plans alive in the process, and nothing in the adapter grows."""
    import gc
    import random
    from fusedattn import _core as core
    core.clear_plan_cache()
    gc.collect()
    # Plans other holders still keep (an XLA executable of an earlier JAX test keeps its calls'
    # plans while it lives) are not fusedattn.torch's: count from them.
    held_elsewhere = core.plan_cache_stats()["live_plans"]
    configs_before, fallbacks_before = fa._plain_config_id.cache_info().currsize, len(fa._fallback.LOGGED)
    core.set_plan_cache_capacity(4)
    try:
        kv = torch.rand(10_000, 2, 64, device="cuda", dtype=torch.bfloat16)
        q_all = torch.rand(10_000, 4, 64, device="cuda", dtype=torch.bfloat16)
        most_alive = 0
        later = list(range(5_001, 10_001))
        random.Random(7).shuffle(later)
        with torch.no_grad():
            for t in list(range(1, 5_001)) + later:
                cu = torch.tensor([0, t], device="cuda", dtype=torch.int32)
                fa.attention(q_all[:t], kv[:t], kv[:t], layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                             max_seqlen_q=t, max_seqlen_kv=t, causal=True)
                most_alive = max(most_alive, core.plan_cache_stats()["live_plans"] - held_elsewhere)
            for s in range(40, 40 + 24 * 8, 8):
                x = torch.rand(1, s, 2, 64, device="cuda", dtype=torch.bfloat16)
                fa.attention(x, x, x)
                most_alive = max(most_alive, core.plan_cache_stats()["live_plans"] - held_elsewhere)
        torch.cuda.synchronize()
        gc.collect()
        stats = core.plan_cache_stats()
        assert most_alive <= 4 and stats["size"] <= 4 and stats["live_plans"] - held_elsewhere <= 4, \
            (most_alive, held_elsewhere, stats)
        assert stats["evictions"] >= 24 and stats["builds"] >= 24 + 8, stats
        # The adapter's only state (configs by option set, fallbacks logged) grew by the one plain config used here.
        assert fa._plain_config_id.cache_info().currsize <= configs_before + 1
        assert len(fa._fallback.LOGGED) == fallbacks_before
    finally:
        core.set_plan_cache_capacity(512)


# Last in the file: a capture that fails leaves PyTorch's generator mid-capture for the tests after it.
def test_cuda_graph_capture_and_replay():
    q, k, v = inputs("bshd", 2, 256, 256, 8, 8, 64)
    d_o = torch.rand(2, 256, 8, 64, device="cuda", dtype=torch.bfloat16)
    # Warm-up (plans built, autograd's gradient accumulators made) on a side stream, as PyTorch
    # asks before capturing a backward: the accumulators then belong to a non-default stream.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = fa.attention(q, k, v, causal=True)
        eager.backward(d_o)
    torch.cuda.current_stream().wait_stream(side)
    eager_grad = q.grad.clone()
    graph = torch.cuda.CUDAGraph()
    q.grad = k.grad = v.grad = None
    with torch.cuda.graph(graph):
        out = fa.attention(q, k, v, causal=True)
        out.backward(d_o)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    assert rel(q.grad, eager_grad) < 1e-2
