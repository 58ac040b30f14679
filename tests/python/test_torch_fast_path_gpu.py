"""fusedattn.torch's C++ fast path on a GPU: plain inference and training calls run in C++ (an
autograd node of its own), against float32 math attention (torch_reference.py) and against the
Python path; it leaves subclasses and modes to the general path, keeps workspaces per stream, and
versions its saved tensors as PyTorch does."""
import types

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")

from fusedattn.torch import _bodies, _call_config, _tensors  # noqa: E402
from torch_reference import TO_BHSD, inputs, reference, rel  # noqa: E402


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


def _capped_reference(q, k, v, cap):
    """float32 attention of bshd q, k, v with cap * tanh(score / cap), causal bottom-right."""
    qb, kb, vb = (t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v))
    ke, ve = (x.repeat_interleave(qb.shape[1] // kb.shape[1], 1) for x in (kb, vb))
    scores = cap * torch.tanh((qb @ ke.transpose(-1, -2)) / qb.shape[-1] ** 0.5 / cap)
    keep = torch.ones(qb.shape[2], kb.shape[2], dtype=torch.bool, device=q.device).tril(kb.shape[2] - qb.shape[2])
    return (torch.softmax(scores.masked_fill(~keep, float("-inf")), -1) @ ve).transpose(1, 2), (qb, kb, vb)


def test_a_softcap_takes_the_cpp_path_forward_and_backward(monkeypatch):
    """A score_mod whose only runtime values are its scalars (Gemma 2's softcap) runs in C++ as a
    plain call does: a decode step over a cache and a training call, against float32 attention of
    the capped scores and against the Python path; a score_mod that reads a tensor stays in Python."""
    fast = pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    calls = []
    monkeypatch.setattr(fa, "_fast", types.SimpleNamespace(
        forward=lambda *args: calls.append(args) or fast.forward(*args)))
    cap = 5.0  # scores of these inputs reach about 10: the cap bends them
    softcap = lambda s, b, h, q_idx, kv_idx: cap * torch.tanh(s / cap)  # noqa: E731
    options = dict(layout="bshd", causal=True, align="bottom_right", score_mod=softcap)
    for s_q in (1, 200):  # a decode step, then a training call
        q, k, v = inputs("bshd", 2, s_q, 333, 8, 2, 64)
        if s_q == 1:
            with torch.no_grad():
                out = fa.attention(q, k, v, **options)
        else:
            out = fa.attention(q, k, v, **options)
            assert out.grad_fn.name() == "fusedattn::AttentionBackward"
        ref, leaves = _capped_reference(q, k, v, cap)
        assert rel(out, ref) < 1e-2, s_q
        assert isinstance(calls[-1][5], torch.Tensor) and calls[-1][5].tolist() == [cap]  # the cap, as a scalar
        with monkeypatch.context() as python_path:  # the same plan (statistics where training) in Python
            python_path.setattr(fa, "_fast", None)
            again = fa.attention(*(t.detach().requires_grad_(s_q > 1) for t in (q, k, v)), **options)
            assert torch.equal(again.detach(), out.detach())
        if s_q > 1:
            d_o = torch.rand_like(out) * 2 - 1
            out.backward(d_o)
            ref.backward(d_o.float())
            for name, ours, theirs in zip("qkv", (q, k, v), leaves):
                assert rel(ours.grad, theirs.grad.transpose(1, 2)) < 1e-2, name
    assert len(calls) == 2
    slopes = torch.rand(8, device="cuda")
    with torch.no_grad():  # a tensor the modifier reads: the Python path's Extras carry it
        fa.attention(q, k, v, layout="bshd", score_mod=lambda s, b, h, q_idx, kv_idx: s + slopes[h] * (kv_idx - q_idx))
    assert len(calls) == 2


def test_forward_stats_and_backward_give_what_the_operator_bodies_give():
    """The C++ path's two passes with no autograd node (flex_attention's pieces run them): O and the
    statistics as the Python path's forward gives them, and its backward's gradients."""
    fast = pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    q, k, v = (t.detach() for t in inputs("bhsd", 2, 200, 333, 8, 2, 64))
    config_id = fa._plain_config_id("bhsd", False, (-1, 0), "bottom_right", False, "vanilla", False)
    text = _call_config.config_text(layout="bhsd", window=(-1, 0), align="bottom_right", stats=True)
    common = dict(bias=None, sink=None, extras=_tensors.Extras(), config=text, scale=0.125, max_seqlen_q=0,
                  max_seqlen_kv=0)
    o, stats = fast.forward_stats(q, k, v, config_id, 0.125, None)
    want_o, want_stats, _ = _bodies.forward_body(q, k, v, **common)
    assert torch.equal(o, want_o) and torch.equal(stats, want_stats) and not o.requires_grad
    d_o = torch.rand_like(o) * 2 - 1
    grads = fast.backward(d_o, q, k, v, o, stats, config_id, 0.125, None)
    for name, ours, theirs in zip("qkv", grads, _bodies.backward_body(d_o, q, k, v, o, stats, **common)[:3]):
        assert ours.stride() == theirs.stride() and rel(ours, theirs) < 1e-3, name


def test_packed_sequences_train_in_cpp_and_match_each_sequence_alone(monkeypatch):
    """Packed sequences (thd with cu_seqlens, as flex_attention's document masks and transformers'
    packed batches call them) on the C++ path: ragged_forward and its node, which keeps the offsets
    for the backward; O and every gradient, sequence by sequence, against float32 attention of that
    sequence alone (lengths of 1 and of more than a tile among them), grouped heads and a softcap;
    a call with the statistics asked for stays in Python and gives the same O."""
    fast = pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    calls = []
    monkeypatch.setattr(fa, "_fast", types.SimpleNamespace(
        forward=fast.forward, ragged_forward=lambda *args: calls.append(args[7]) or fast.ragged_forward(*args)))
    lengths = [37, 200, 1, 129]
    starts = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    cu = torch.tensor(starts, dtype=torch.int32, device="cuda")
    total = starts[-1]
    q, k, v = ((torch.rand(total, h, 64, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
               for h in (8, 2, 2))
    capped = lambda score, b, h, q_idx, kv_idx: 20.0 * torch.tanh(score / 20.0)  # noqa: E731
    for score_mod in (None, capped):
        for t in (q, k, v):
            t.grad = None
        call = dict(layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths),
                    max_seqlen_kv=max(lengths), causal=True, score_mod=score_mod)
        out = fa.attention(q, k, v, **call)  # every token is checked below, in its sequence
        assert out.grad_fn.name() == "fusedattn::AttentionBackward" and len(calls) == 1 + (score_mod is not None)
        d_o = torch.rand_like(out) * 2 - 1
        out.backward(d_o)
        for start, end in zip(starts, starts[1:]):
            alone = [t.detach()[start:end].unsqueeze(0) for t in (q, k, v)]
            ref, leaves = reference(*alone, "bshd", causal=True) if score_mod is None else \
                _capped_reference(*alone, capped)
            ref.backward(d_o[start:end].unsqueeze(0).float())
            assert rel(out[start:end], ref[0]) < 1e-2, (score_mod, start)
            for t, leaf in zip((q, k, v), leaves):
                got = t.grad[start:end]
                assert torch.isfinite(got).all() and rel(got, leaf.grad.transpose(1, 2)[0]) < 1e-2, (score_mod, start)
        with torch.no_grad():
            python, _ = fa.attention(q, k, v, **call, return_stats=True)
        assert torch.equal(python, out.detach())


def _capped_reference(q, k, v, score_mod):
    """float32 causal attention of [1, s, h, d] q, k, v with score_mod on the scaled scores: O
    [1, s, h, d] and the [1, h, s, d] leaves."""
    qb, kb, vb = (t.float().transpose(1, 2).requires_grad_() for t in (q, k, v))
    groups = qb.shape[1] // kb.shape[1]
    ke, ve = kb.repeat_interleave(groups, 1), vb.repeat_interleave(groups, 1)
    scores = score_mod(qb @ ke.transpose(-1, -2) / qb.shape[-1] ** 0.5, None, None, None, None)
    s = scores.shape[-1]
    keep = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    out = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1) @ ve
    return out.transpose(1, 2), (qb, kb, vb)
