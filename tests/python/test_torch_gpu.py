"""fusedattn.torch on a GPU, against torch.nn.functional.scaled_dot_product_attention in float32
(upcast inputs, math backend) for outputs and gradients; torch.compile, CUDA graphs, streams,
errors and the fallback."""
import logging
import types

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import fusedattn  # noqa: E402
from fusedattn.torch import _bodies, _call_config, _tensors  # noqa: E402

TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
TO_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def reference(q, k, v, layout, causal=False, align="top_left", bias=None, sink=None):
    """float32 math attention on [b, h, s, d] views; a sink adds e^sink[h] to each row's denominator."""
    qb, kb, vb = (t.detach().float().permute(*TO_BHSD[layout]).requires_grad_() for t in (q, k, v))
    s_q, s_kv = qb.shape[2], kb.shape[2]
    groups = qb.shape[1] // kb.shape[1]
    ke, ve = kb.repeat_interleave(groups, 1), vb.repeat_interleave(groups, 1)
    scores = qb @ ke.transpose(-1, -2) / qb.shape[-1] ** 0.5
    if bias is not None:
        scores = scores + bias.float()
    if causal:
        shift = s_kv - s_q if align == "bottom_right" else 0
        keep = torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device).tril(shift)
        scores = scores.masked_fill(~keep, float("-inf"))
    if sink is not None:
        extra = sink.detach().float().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        probs = torch.softmax(torch.cat([scores, extra], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    out = probs @ ve
    back = [0] * 4
    for logical, axis in enumerate(TO_BHSD[layout]):
        back[axis] = logical
    return out.permute(*back), (qb, kb, vb)


def inputs(layout, b, s_q, s_kv, h_q, h_kv, d, dtype=torch.bfloat16):
    def make(s, h):
        shape = {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "bhsd": (b, h, s, d)}[layout]
        return (torch.rand(shape, device="cuda", dtype=dtype) * 2 - 1).requires_grad_()
    return make(s_q, h_q), make(s_kv, h_kv), make(s_kv, h_kv)


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


def test_compiled_block_has_no_graph_break_and_matches_eager():
    from test_torch_meta import Block
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


@pytest.mark.parametrize("cache_layout", ["bshd", "sbhd"])
def test_paged_decode_matches_attention_on_the_gathered_cache(cache_layout):
    b, s_kv, page, h_q, h_kv, d = 4, 1024, 64, 16, 4, 128
    per_seq = s_kv // page
    k = torch.rand(b, s_kv, h_kv, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    v = torch.rand_like(k) * 2 - 1
    q = torch.rand(b, 1, h_q, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    pages = b * per_seq + 5
    order = torch.randperm(pages, device="cuda")[: b * per_seq]
    table = order.to(torch.int32).reshape(b, per_seq)

    def pool_of(x):  # each sequence's pages scattered to the table's pool pages
        pool = torch.zeros(pages, page, h_kv, d, device="cuda", dtype=x.dtype)
        pool[order] = x.reshape(b * per_seq, page, h_kv, d)
        return pool if cache_layout == "bshd" else pool.transpose(0, 1).contiguous()
    lengths = torch.tensor([1024, 1, 700, 64], device="cuda", dtype=torch.int32)
    o = fa.paged_attention(q, pool_of(k), pool_of(v), table, table, lengths, cache_layout=cache_layout)
    for i in range(b):
        n = int(lengths[i])
        ref, _ = reference(q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], "bshd")
        assert rel(o[i:i + 1], ref) < 1e-2


@pytest.mark.parametrize("batch, s_kv", [(1, 8192), (64, 1024)])  # split on an H200, and not
def test_a_captured_decode_step_replays_with_new_lengths_and_queries(batch, s_kv):
    """A serving engine's decode step: captured once, replayed with new queries and lengths written
    in place; seq_len_q left out (every sequence's one query). Outputs poisoned before each replay."""
    page, h_q, h_kv, d = 64, 32, 8, 128
    per_seq = s_kv // page
    k_pool = torch.rand(batch * per_seq, page, h_kv, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    v_pool = torch.rand_like(k_pool) * 2 - 1
    table = torch.randperm(batch * per_seq, device="cuda").to(torch.int32).reshape(batch, per_seq)
    q = torch.empty(batch, 1, h_q, d, device="cuda", dtype=torch.bfloat16)
    lengths = torch.full((batch,), s_kv, device="cuda", dtype=torch.int32)
    with torch.no_grad():
        fa.paged_attention(q.uniform_(-1, 1), k_pool, v_pool, table, table, lengths)  # the plan, built outside
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fa.paged_attention(q, k_pool, v_pool, table, table, lengths)
        for step in range(3):
            q.uniform_(-1, 1)
            lengths.copy_(torch.randint(1, s_kv + 1, (batch,), device="cuda", dtype=torch.int32))
            lengths[0] = (s_kv, 1, s_kv - 37)[step]
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for i in range(batch):
                n = int(lengths[i])
                keys = [pool[table[i].long()].reshape(1, s_kv, h_kv, d)[:, :n] for pool in (k_pool, v_pool)]
                ref, _ = reference(q[i:i + 1], *keys, "bshd")
                assert rel(out[i:i + 1], ref) < 1e-2, (step, i, n)


def test_a_ragged_speculative_step_over_pages_matches_float32():
    """thd queries (1 and 3 a sequence, and an empty one) over a paged cache, bottom-right causal:
    split on an H200 into 5 chunks and the masked call, against each sequence's float32 attention."""
    page, h_q, h_kv, d, s_kv = 64, 32, 8, 128, 4096
    queries, keys = [1, 0, 3], [4096, 0, 2001]
    per_seq = s_kv // page
    b = len(queries)
    k_pool = torch.rand(b * per_seq, page, h_kv, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    v_pool = torch.rand_like(k_pool) * 2 - 1
    table = torch.randperm(b * per_seq, device="cuda").to(torch.int32).reshape(b, per_seq)
    q = torch.rand(sum(queries), h_q, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    cu = torch.tensor([0, 1, 1, 4], device="cuda", dtype=torch.int32)
    lengths = torch.tensor(keys, device="cuda", dtype=torch.int32)
    with torch.no_grad():
        o = fa.paged_attention(q, k_pool, v_pool, table, table, lengths, layout="thd", cu_seqlens_q=cu,
                               max_seqlen_q=max(queries))
    assert o.shape == q.shape
    for i in (0, 2):
        start, n = int(cu[i]), keys[i]
        gathered = [pool[table[i].long()].reshape(1, s_kv, h_kv, d)[:, :n] for pool in (k_pool, v_pool)]
        ref, _ = reference(q[start:start + queries[i]].unsqueeze(0), *gathered, "bshd", causal=True,
                           align="bottom_right")
        assert rel(o[start:start + queries[i]].unsqueeze(0), ref) < 1e-2, i


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


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_plain_inference_goes_to_cpp_and_matches_float32(layout, monkeypatch):
    fast = pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    calls = []
    monkeypatch.setattr(fa, "_fast", types.SimpleNamespace(
        forward=lambda *args: calls.append(args[3]) or fast.forward(*args)))
    q, k, v = (t.detach() for t in inputs(layout, 2, 200, 300, 8, 2, 64))
    settings = ((True, "bottom_right", (-1, -1)), (True, "top_left", [-1, -1]), (False, "top_left", (-1, -1)))
    for causal, align, window in settings:
        for repeat in range(3):  # the later calls replay the first's recording
            with torch.no_grad():
                out = fa.attention(q, k, v, layout=layout, causal=causal, align=align, window=window)
            ref, _ = reference(q, k, v, layout, causal=causal, align=align)
            assert rel(out, ref) < 1e-2, (causal, align, repeat)
    assert len(calls) == 9 and len(set(calls)) == 3  # every call in C++, one config id per setting
    with torch.no_grad():  # a call the C++ path does not take (statistics asked for) stays in Python
        fa.attention(q, k, v, layout=layout, causal=True, return_stats=True)
    assert len(calls) == 9


PLAIN = ("bshd", False, (-1, -1), "top_left", False, "vanilla", False)  # fa._plain_config_id's arguments


def test_the_cpp_fast_path_leaves_subclasses_and_modes_to_the_general_path():
    fast = pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    q, k, v = inputs("bshd", 2, 100, 120, 4, 4, 64)  # requiring grad
    config_id = fa._plain_config_id(*PLAIN)
    with torch.no_grad():
        plain = fast.forward(q, k, v, config_id, None)
        assert torch.equal(plain, fast.forward(q, k, v, config_id, 0.125))  # None: 1/sqrt(64)
        assert rel(plain, reference(q, k, v, "bshd")[0]) < 1e-2
        with torch.autograd.forward_ad.dual_level():  # forward-mode AD: PyTorch's machinery
            dual = torch.autograd.forward_ad.make_dual(q.detach(), torch.ones_like(q))
            assert fast.forward(dual, k, v, config_id, None) is NotImplemented

        class Tagged(torch.Tensor):
            pass
        assert fast.forward(q.as_subclass(Tagged), k, v, config_id, None) is NotImplemented

        class Seen(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(str(func))
                return func(*args, **(kwargs or {}))
        with Seen() as seen:
            assert fast.forward(q, k, v, config_id, None) is NotImplemented
            watched = fa.attention(q, k, v)
        assert "fusedattn.forward.default" in seen.ops  # the mode saw the operator, not its insides
        assert torch.equal(watched, plain)
        with FakeTensorMode() as mode:  # shapes only: nothing runs
            fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
            shaped = fa.attention(fq, fk, fv, causal=True)
        assert shaped.shape == plain.shape and shaped.device == plain.device and shaped.dtype == plain.dtype


def test_inference_on_several_streams_and_under_capture():
    """The C++ path keeps small workspaces per stream: calls of two sizes (the workspace grows)
    interleaved on two streams, then a captured call, each against float32 attention."""
    problems = [tuple(t.detach() for t in inputs("bshd", *shape)) for shape in
                ((1, 64, 64, 2, 2, 64), (2, 700, 900, 8, 2, 128))]
    expected = [reference(q, k, v, "bshd", causal=True)[0] for q, k, v in problems]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(2)]
    results = []
    with torch.no_grad():
        for _ in range(4):
            for stream in streams:
                with torch.cuda.stream(stream):
                    results += [(i, fa.attention(*problem, causal=True)) for i, problem in enumerate(problems)]
        torch.cuda.synchronize()
        for i, out in results:
            assert rel(out, expected[i]) < 1e-2
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fa.attention(*problems[1], causal=True)
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
    assert rel(captured, expected[1]) < 1e-2


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


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_the_cpp_fast_path_gives_what_the_python_path_gives(layout):
    fast = pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    q, k, v = (t.detach() for t in inputs(layout, 2, 200, 300, 8, 2, 64))
    packed = torch.rand(300, 2, 2, 2, 64, device="cuda", dtype=torch.bfloat16)  # a KV view with odd strides
    if layout == "sbhd":
        k, v = packed[:, :, 0], packed[:, :, 1]
    config_id = fa._plain_config_id(layout, True, (-1, -1), "bottom_right", False, "vanilla", False)
    text = _call_config.config_text(layout=layout, causal=True, window=(-1, -1), align="bottom_right", stats=False)
    with torch.no_grad():
        ours = fast.forward(q, k, v, config_id, 0.125)
        python, _, _ = _bodies.forward_body(q, k, v, bias=None, sink=None, extras=_tensors.Extras(), config=text,
                                            scale=0.125, max_seqlen_q=0, max_seqlen_kv=0)
    assert torch.equal(ours, python)
    assert ours.shape == python.shape and ours.stride() == python.stride()


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_training_runs_in_cpp_with_a_cpp_autograd_node_and_matches_float32(layout):
    """A plain eager training call: C++ forward with statistics, O's grad_fn the C++ node, and the
    gradients (packed KV views included) against float32 attention and against the Python path."""
    pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    q, k, v = inputs(layout, 2, 200, 333, 8, 2, 64)
    d_o = torch.rand(q.shape, device="cuda", dtype=q.dtype) * 2 - 1
    out = fa.attention(q, k, v, layout=layout, causal=True, align="bottom_right")
    assert out.grad_fn.name() == "fusedattn::AttentionBackward"
    out.backward(d_o)
    ref, leaves = reference(q, k, v, layout, causal=True, align="bottom_right")
    ref.backward(d_o.float())
    assert rel(out, ref) < 1e-2
    for got, leaf in zip((q.grad, k.grad, v.grad), leaves):
        assert rel(got, leaf.grad.permute(*[TO_BHSD[layout].index(i) for i in range(4)])) < 1e-2
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    python, _ = fa.attention(q, k, v, layout=layout, causal=True, align="bottom_right", return_stats=True)
    assert python.grad_fn.name() != "fusedattn::AttentionBackward"  # statistics asked for: the Python path
    python.backward(d_o)
    assert torch.equal(python, out)
    for t, grad in zip((q, k, v), grads):
        assert rel(t.grad, grad) < 1e-3  # the same plans; dQ's accumulation order may differ
    packed = torch.rand(2, 333, 2, 2, 64, device="cuda", dtype=q.dtype, requires_grad=True)
    if layout == "bshd":  # K and V as views of one [b, s, 2, h, d] buffer get a packed gradient
        out = fa.attention(q.detach(), packed[:, :, 0], packed[:, :, 1], layout=layout, causal=True)
        out.backward(d_o)
        assert packed.grad.shape == packed.shape and torch.isfinite(packed.grad).all()


def test_the_cpp_autograd_node_keeps_saved_tensors_honest():
    """The node's saved inputs are versioned like PyTorch's own: an in-place change before the
    backward raises instead of giving wrong gradients; retain_graph lets it run twice."""
    pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    q, k, v = (t.detach().clone().requires_grad_() for t in inputs("bshd", 1, 64, 64, 2, 2, 64))
    out = fa.attention(q * 1, k, v)
    out.sum().backward(retain_graph=True)
    first = k.grad.clone()
    out.sum().backward()
    assert torch.allclose(k.grad, 2 * first, rtol=1e-2, atol=1e-3)
    x = q.detach().clone().requires_grad_()
    y = x * 1
    out = fa.attention(y, k, v)
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


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
