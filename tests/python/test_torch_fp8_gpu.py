"""fusedattn.torch.fp8_attention on a GPU: both scaling recipes, the FP8 and the model-precision
backward, against float32 math attention of the unquantized inputs (so the errors include the
inputs' quantization: the tolerances are about twice what the C++ FP8 check prints against
fusedattn's BF16 result, tests/gpu/test_fp8_attention_gpu.cpp), the recipes' scales, and the refusals."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)
if torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("FP8 attention needs SM 9.0 or newer", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")

import fusedattn  # noqa: E402
from test_torch_gpu import reference, rel  # noqa: E402

O_TOLERANCE, GRAD_TOLERANCE = 0.1, 0.15


def inputs(b=2, s=256, h=4, d=128, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.rand(b, s, h, d, device="cuda", generator=generator) * 2 - 1).to(torch.bfloat16).requires_grad_()
            for _ in range(3)]


@pytest.mark.parametrize("recipe", ["current", "delayed"])
@pytest.mark.parametrize("backward", ["fp8", "model"])
@pytest.mark.parametrize("causal", [True, False])
def test_matches_float32_attention_over_steps(recipe, backward, causal):
    state = fa.Fp8State(recipe, history=4)
    for step in range(3):  # delayed scaling uses the history from the second step on
        q, k, v = inputs(seed=step)
        d_o = torch.rand_like(q) * 2 - 1
        o = fa.fp8_attention(q, k, v, state, causal=causal, backward=backward)
        assert o.dtype == torch.bfloat16 and o.shape == q.shape
        o.backward(d_o)
        ref, (qb, kb, vb) = reference(q, k, v, "bshd", causal=causal)
        ref.backward(d_o.float())
        errors = {"o": rel(o, ref)}
        for name, got, want in (("dq", q.grad, qb.grad), ("dk", k.grad, kb.grad), ("dv", v.grad, vb.grad)):
            errors[name] = rel(got.permute(0, 2, 1, 3), want)
        assert errors["o"] < O_TOLERANCE, (step, errors)
        assert max(errors[n] for n in ("dq", "dk", "dv")) < GRAD_TOLERANCE, (step, errors)


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_the_hybrid_recipe_matches_float32_attention_with_e5m2_gradients(recipe):
    # E4M3 forward, dO, dP and the gradients in E5M2: the gradients' tolerance is E5M2's (one
    # mantissa bit less), as in the C++ check.
    state = fa.Fp8State(recipe, history=4, grad_dtype=torch.float8_e5m2)
    for step in range(3):
        q, k, v = inputs(seed=30 + step)
        d_o = (torch.rand_like(q) * 2 - 1) * 1e3  # beyond E4M3's range at scale 1: E5M2's is needed
        o = fa.fp8_attention(q, k, v, state, causal=True)
        o.backward(d_o)
        ref, (qb, kb, vb) = reference(q, k, v, "bshd", causal=True)
        ref.backward(d_o.float())
        errors = [rel(got.permute(0, 2, 1, 3), want.grad) for got, want in ((q.grad, qb), (k.grad, kb), (v.grad, vb))]
        assert rel(o, ref) < O_TOLERANCE and max(errors) < 2 * GRAD_TOLERANCE, (step, errors)
    from fusedattn._fp8_recipe import SLOT as slot
    largest = state.histories.max(dim=1).values if recipe == "delayed" else state.scalars[:, 2]
    assert state.scalars[slot["d_o"], 0].item() == pytest.approx(57344.0 / largest[slot["d_o"]].item(), rel=1e-6)
    assert state.scalars[slot["d_q"], 0].item() == pytest.approx(
        57344.0 / (state.histories[slot["d_q"]].max().item() * 4), rel=1e-6)
    assert state.scalars[slot["q"], 0].item() == pytest.approx(448.0 / largest[slot["q"]].item(), rel=1e-6)


def test_current_scaling_measures_this_calls_amax():
    state = fa.Fp8State("current")
    q, k, v = inputs(seed=3)
    with torch.no_grad():
        fa.fp8_attention(q, k, v, state, causal=True)
    torch.cuda.synchronize()
    slot = state.scalars[0]  # q: scale, descale, amax
    assert slot[2].item() == q.abs().max().float().item()
    assert slot[0].item() == pytest.approx(448.0 / slot[2].item(), rel=1e-6)
    assert state.scalars[3, 0].item() == 448.0  # the probabilities' scale is fixed


def test_delayed_scaling_keeps_a_history():
    state = fa.Fp8State("delayed", history=3)
    amaxes = []
    for step in range(4):
        q, k, v = inputs(seed=20 + step)
        q = (q.detach() * (step + 1)).requires_grad_()  # a growing amax
        amaxes.append(q.abs().max().float().item())
        with torch.no_grad():
            fa.fp8_attention(q, k, v, state, causal=True)
    torch.cuda.synchronize()
    assert state.histories[0].tolist() == pytest.approx(amaxes[::-1][:3])  # slot 0 the newest
    assert state.scalars[0, 0].item() == pytest.approx(448.0 / max(amaxes[1:]), rel=1e-6)


def test_refusals_name_the_field():
    state = fa.Fp8State()
    q, k, v = inputs(d=64)
    with pytest.raises(fusedattn.errors.NotSupportedError, match="d_qk"):  # Hopper's FP8 backward: d = 128
        fa.fp8_attention(q, k, v, state, causal=True).backward(torch.ones_like(q))
    with pytest.raises(fusedattn.errors.InvalidArgumentError, match="state"):
        fa.fp8_attention(q, k, v, None)
    with pytest.raises(fusedattn.errors.InvalidArgumentError, match="recipe"):
        fa.Fp8State("hybrid")


def test_two_forwards_before_their_backwards():
    """The backward undoes the scales its own forward used, even after the state moved on."""
    state = fa.Fp8State("delayed", history=2)
    calls = []
    for step in range(2):
        q, k, v = inputs(seed=30 + step)
        # The first forward quantizes with the initial scale 1, the second with 448 from the history.
        q = (q.detach() * (0.25 if step else 1)).requires_grad_()
        calls.append((q, k, v, fa.fp8_attention(q, k, v, state, causal=True)))
    for q, k, v, o in reversed(calls):
        d_o = torch.rand_like(q) * 2 - 1
        o.backward(d_o)
        ref, (qb, kb, vb) = reference(q, k, v, "bshd", causal=True)
        ref.backward(d_o.float())
        assert rel(q.grad.permute(0, 2, 1, 3), qb.grad) < GRAD_TOLERANCE
        assert rel(v.grad.permute(0, 2, 1, 3), vb.grad) < GRAD_TOLERANCE


@pytest.mark.parametrize("recipe", ["current", "delayed"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_training_steps_match_eager(recipe, backend):
    """torch.compile(fullgraph=True) of a block with fp8_attention: no graph break, one more
    compilation once the state's first backward is traced (the calibration flag), and O, the
    gradients and the state within 1e-2 of eager steps (SGD between) over two steps."""
    import copy
    from torch._dynamo.utils import counters
    from torch_blocks import Fp8Block
    torch.manual_seed(0)
    eager = Fp8Block(state=fa.Fp8State(recipe, history=4)).to(device="cuda", dtype=torch.bfloat16)
    twin = copy.deepcopy(eager)
    twin.state = fa.Fp8State(recipe, history=4)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(twin, fullgraph=True, backend=backend)
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-3) for m in (eager, twin)]
    generator = torch.Generator(device="cuda").manual_seed(1)
    for step in range(2):
        x = (torch.rand(2, 256, 256, device="cuda", generator=generator) * 2 - 1).to(torch.bfloat16)
        d_y = (torch.rand(2, 256, 256, device="cuda", generator=generator) * 2 - 1).to(torch.bfloat16)
        x_e, x_c = x.clone().requires_grad_(), x.clone().requires_grad_()
        y_e, y_c = eager(x_e), compiled(x_c)
        y_e.backward(d_y)
        y_c.backward(d_y)
        errors = {"y - x": rel(y_c - x_c, y_e - x_e), "dx": rel(x_c.grad, x_e.grad)}
        for name, p_e in eager.named_parameters():
            errors[name] = rel(twin.get_parameter(name).grad, p_e.grad)
        assert max(errors.values()) < 1e-2, (step, errors)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    torch.cuda.synchronize()
    assert rel(twin.state.buffer, eager.state.buffer) < 1e-2
    assert twin.state.calibrated and eager.state.calibrated
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2


# --- inputs already in FP8 (forward only) ------------------------------------------------------------

def quantized(x, dtype=torch.float8_e4m3fn):
    """x in FP8 by current scaling, as an FP8 projection hands it on: (x8, descale [1])."""
    scale = torch.finfo(dtype).max / x.detach().abs().max().float()
    return (x.detach().float() * scale).to(dtype), (1.0 / scale).reshape(1)


def fp8_problem(layout, seed, dtype=torch.float8_e4m3fn):
    q, k, v = inputs(seed=seed)
    if layout == "sbhd":
        q, k, v = (t.detach().transpose(0, 1).contiguous() for t in (q, k, v))
    pairs = [quantized(t, dtype) for t in (q, k, v)]
    values = [x8.float() * descale for x8, descale in pairs]  # what the FP8 tensors hold
    return [x8 for x8, _ in pairs], tuple(descale for _, descale in pairs), values


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


def captured_training_step(static, state, d_o):
    """(graph, O): a causal fp8_attention forward and backward on `static` captured in a CUDA graph,
    after two eager steps on a side stream (which build the plans and calibrate the state)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fa.fp8_attention(*static, state, causal=True).backward(d_o)
    torch.cuda.current_stream().wait_stream(side)
    for t in static:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa.fp8_attention(*static, state, causal=True)
        out.backward(d_o)
    return graph, out


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_a_training_step_replays_in_a_cuda_graph_with_each_steps_values_and_scales(recipe):
    # Quantizing, the FP8 forward and backward and the recipe's updates, captured once after two eager
    # steps (which build the plans and calibrate the state), then replayed on new inputs: each replay
    # must give what an eager step gives on a twin of the state as it was before that replay.
    state, static = fa.Fp8State(recipe, history=4), inputs(seed=20)
    d_o = torch.rand_like(static[0]) * 2 - 1
    graph, out = captured_training_step(static, state, d_o)
    for seed in (21, 22, 23):
        fresh = inputs(seed=seed)
        twin = fa.Fp8State(recipe, history=4)
        twin.buffer.copy_(state.buffer)
        twin.calibrated = True
        want = fa.fp8_attention(*fresh, twin, causal=True)
        want.backward(d_o)
        with torch.no_grad():
            for dst, src in zip(static, fresh):
                dst.copy_(src)
                dst.grad.fill_(float("nan"))
            out.fill_(float("nan"))
        graph.replay()
        assert rel(out, want) < 1e-2, seed
        assert max(rel(t.grad, f.grad) for t, f in zip(static, fresh)) < 1e-2, seed
        torch.testing.assert_close(state.buffer, twin.buffer, rtol=1e-5, atol=0)  # the same updates
        ref, bhsd = reference(*fresh, "bshd", causal=True)
        ref.backward(d_o.float())
        assert rel(out, ref) < O_TOLERANCE
        assert max(rel(t.grad.permute(0, 2, 1, 3), b.grad) for t, b in zip(static, bhsd)) < GRAD_TOLERANCE


# --- Fp8Tensors: inputs already in FP8, differentiable -----------------------------------------------

def fp8_tensors(layout, seed, dtype=torch.float8_e4m3fn):
    """Fp8Tensor leaves of fresh FP8 payloads and their descales, and their values in float32."""
    payloads, descales, values = fp8_problem(layout, seed, dtype)
    leaves = [fa.Fp8Tensor(x8, d, torch.bfloat16, requires_grad=True) for x8, d in zip(payloads, descales)]
    return leaves, values


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
        o = fa.fp8_attention(*(fa.fp8_quantize(t) for t in (q, k, v)), states[0], layout=layout, causal=True)
        want = fa.fp8_attention(*twins, states[1], layout=layout, causal=True)
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
