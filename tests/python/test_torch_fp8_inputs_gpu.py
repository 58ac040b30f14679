"""fusedattn.torch.fp8_attention on inputs already in FP8, on a GPU: plain FP8 tensors with their
descales (forward only) and Fp8Tensors (differentiable), against float32 math attention of the values
they hold (the errors are then the kernels' alone), as the quantizing road gives, compiled, and
replayed in CUDA graphs."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)
if torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("FP8 attention needs SM 9.0 or newer", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")

from torch_fp8_problems import captured_training_step, fp8_problem, fp8_tensors, inputs  # noqa: E402
from torch_reference import reference, rel  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
@pytest.mark.parametrize("causal", [True, False])
def test_fp8_inputs_match_float32_attention_of_their_values(causal, layout, dtype):
    # Against float32 attention of the FP8 inputs' own values, the errors are the kernel's (the
    # probabilities and O rounded to FP8): the C++ check's forward tolerance, 2^-(m+1).
    tolerance = 2.0 ** -4 if dtype == torch.float8_e4m3fn else 2.0 ** -3
    (q8, k8, v8), descales, values = fp8_problem(layout, seed=11, dtype=dtype)
    want, _ = reference(*values, layout, causal=causal)
    state = fa.Fp8State("current", dtype=dtype)
    o = fa.fp8_attention(q8, k8, v8, state, layout=layout, causal=causal, descales=descales)
    assert o.dtype == torch.bfloat16 and o.shape == q8.shape
    assert rel(o, want) < tolerance
    o8, descale_o = fa.fp8_attention(q8, k8, v8, state, layout=layout, causal=causal, descales=descales,
                                     out_dtype=dtype)
    assert o8.dtype == dtype and descale_o.shape == (1,)
    assert rel(o8.float() * descale_o, want) < tolerance
    amax_v = values[2].abs().max()
    assert descale_o.item() == pytest.approx(amax_v.item() / torch.finfo(dtype).max, rel=1e-5)  # O's scale from V


def test_fp8_inputs_replay_in_a_cuda_graph_with_new_values_and_scales():
    (q8, k8, v8), descales, _ = fp8_problem("bshd", seed=12)
    state = fa.Fp8State("current")
    static = [t.clone() for t in (q8, k8, v8)], tuple(t.clone() for t in descales)
    fa.fp8_attention(*static[0], state, causal=True, descales=static[1])  # plans built outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa.fp8_attention(*static[0], state, causal=True, descales=static[1])
    for seed in (13, 14):
        (q8, k8, v8), descales, values = fp8_problem("bshd", seed=seed)
        for dst, src in zip((*static[0], *static[1]), (q8, k8, v8, *descales)):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        want, _ = reference(*values, "bshd", causal=True)
        assert rel(out, want) < 2.0 ** -4, seed


@pytest.mark.parametrize("recipe", ["current", "delayed"])
@pytest.mark.parametrize("backward", ["fp8", "model"])
@pytest.mark.parametrize("causal", [True, False])
def test_fp8_tensors_have_the_gradients_of_their_values(recipe, backward, causal):
    # Against float32 attention of the inputs' own values the errors are the kernels' alone: the C++
    # check's tolerances for E4M3, 2^-4 forward and twice that for the gradients. Three steps, so the
    # delayed recipe's scales of dO and the kernel-written gradients move.
    state = fa.Fp8State(recipe, history=4)
    for step in range(3):
        (q, k, v), values = fp8_tensors("bshd", seed=40 + step)
        d_o = torch.rand(q.shape, device="cuda", dtype=torch.bfloat16) * 2 - 1
        o = fa.fp8_attention(q, k, v, state, causal=causal, backward=backward)
        assert type(o) is torch.Tensor and o.dtype == torch.bfloat16
        o.backward(d_o)
        ref, bhsd = reference(*values, "bshd", causal=causal)
        ref.backward(d_o.float())
        errors = [rel(t.grad.permute(0, 2, 1, 3), b.grad) for t, b in zip((q, k, v), bhsd)]
        assert all(type(t.grad) is torch.Tensor and t.grad.dtype == torch.bfloat16 for t in (q, k, v))
        assert rel(o, ref) < 2.0 ** -4 and max(errors) < 2.0 ** -3, (step, rel(o, ref), errors)


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_quantized_fp8_tensors_train_as_the_quantizing_road_does(layout):
    # fp8_quantize's current scaling is the "current" recipe's, so Fp8Tensors made from x give what
    # passing x does, through a state of their own, and x's gradient comes straight through.
    states = fa.Fp8State("current"), fa.Fp8State("current")
    for step in range(2):
        q, k, v = inputs(seed=50 + step)
        if layout == "sbhd":
            q, k, v = (t.detach().transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v))
        twins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        d_o = torch.rand_like(q) * 2 - 1
        # Both through cuDNN's FP8 backward: the model's backward would see x itself on the one road
        # and only its dequantized copy on the other.
        o = fa.fp8_attention(*(fa.fp8_quantize(t) for t in (q, k, v)), states[0], layout=layout, causal=True,
                             backward="fp8")
        want = fa.fp8_attention(*twins, states[1], layout=layout, causal=True, backward="fp8")
        o.backward(d_o)
        want.backward(d_o)
        assert rel(o, want) < 1e-2, step
        assert max(rel(t.grad, w.grad) for t, w in zip((q, k, v), twins)) < 1e-2, step


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_fp8_tensor_steps_match_eager(backend):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    states = fa.Fp8State("delayed", history=4), fa.Fp8State("delayed", history=4)
    compiled = torch.compile(lambda q, k, v: fa.fp8_attention(q, k, v, states[1], causal=True), fullgraph=True,
                             backend=backend)
    for seed in range(3):
        leaves, _ = fp8_tensors("bshd", seed=60 + seed)
        twins = [fa.Fp8Tensor(t.data8, t.descale, t.dtype, requires_grad=True) for t in leaves]
        d_o = torch.rand(leaves[0].shape, device="cuda", dtype=torch.bfloat16) * 2 - 1
        want, got = fa.fp8_attention(*leaves, states[0], causal=True), compiled(*twins)
        want.backward(d_o)
        got.backward(d_o)
        assert rel(got, want) < 1e-2, seed
        assert max(rel(t.grad, w.grad) for t, w in zip(twins, leaves)) < 1e-2, seed
    assert rel(states[1].buffer, states[0].buffer) < 1e-2
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_an_fp8_tensor_training_step_replays_in_a_cuda_graph():
    state = fa.Fp8State("current", history=4)
    static, _ = fp8_tensors("bshd", seed=70)
    d_o = torch.rand(static[0].shape, device="cuda", dtype=torch.bfloat16) * 2 - 1
    graph, out = captured_training_step(static, state, d_o)
    for seed in (71, 72):
        fresh, values = fp8_tensors("bshd", seed=seed)
        with torch.no_grad():
            for dst, src in zip(static, fresh):
                dst.data8.copy_(src.data8)
                dst.descale.copy_(src.descale)
                dst.grad.fill_(float("nan"))
            out.fill_(float("nan"))
        graph.replay()
        ref, bhsd = reference(*values, "bshd", causal=True)
        ref.backward(d_o.float())
        assert rel(out, ref) < 2.0 ** -4, seed
        assert max(rel(t.grad.permute(0, 2, 1, 3), b.grad) for t, b in zip(static, bhsd)) < 2.0 ** -3, seed
