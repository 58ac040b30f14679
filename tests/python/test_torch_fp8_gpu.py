"""fusedattn.torch.fp8_attention on a GPU: both scaling recipes, the FP8 and the model-precision
backward, against float32 math attention of the unquantized inputs (so the errors include the
inputs' quantization: the tolerances are about twice what the C++ FP8 check prints against
fusedattn's BF16 result, tests/gpu/test_fp8_attention_gpu.cpp), the recipes' scales, the refusals,
torch.compile and a training step replayed in a CUDA graph. Inputs already in FP8:
test_torch_fp8_inputs_gpu.py."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)
if torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("FP8 attention needs SM 9.0 or newer", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")

import fusedattn  # noqa: E402
from torch_blocks import Fp8Block  # noqa: E402
from torch_fp8_problems import captured_training_step, inputs  # noqa: E402
from loaded_cudnn import skip_if_refused_for_the_loaded_cudnn  # noqa: E402
from torch_reference import reference, rel  # noqa: E402

O_TOLERANCE, GRAD_TOLERANCE = 0.1, 0.15


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


@pytest.mark.parametrize("backward", ["fp8", "model"])
@pytest.mark.parametrize("causal", [True, False])
def test_runtime_lengths_match_float32_attention_of_each_sequences_tokens(backward, causal):
    """seq_len_q and seq_len_kv (a padding mask, as TransformerEngine's FP8 attention takes it): the
    reference masks the keys past each length with a bias, and its rows past them get no gradient;
    fusedattn's O and gradients past the lengths are zero."""
    skip_if_refused_for_the_loaded_cudnn("layout=bshd dtype=e4m3 b=3 s=256 h=4 d=128 padding=1")
    state = fa.Fp8State("current")
    q, k, v = inputs(b=3, s=256)
    seq_len_q = torch.tensor([256, 100, 37], dtype=torch.int32, device="cuda")
    seq_len_kv = torch.tensor([256, 180, 37], dtype=torch.int32, device="cuda")
    positions = torch.arange(256, device="cuda")
    real_q = positions.view(1, 256) < seq_len_q.view(3, 1)    # [b, s]
    real_kv = positions.view(1, 256) < seq_len_kv.view(3, 1)
    d_o = (torch.rand_like(q) * 2 - 1) * real_q.view(3, 256, 1, 1)
    o = fa.fp8_attention(q, k, v, state, causal=causal, backward=backward, seq_len_q=seq_len_q,
                         seq_len_kv=seq_len_kv)
    o.backward(d_o)
    bias = torch.zeros(3, 1, 1, 256, device="cuda").masked_fill(~real_kv.view(3, 1, 1, 256), float("-inf"))
    ref, (qb, kb, vb) = reference(q, k, v, "bshd", causal=causal, bias=bias)
    ref.backward(d_o.float())
    rows, keys = real_q.view(3, 256, 1, 1), real_kv.view(3, 256, 1, 1)
    assert torch.all(o.masked_select(~rows) == 0) and torch.all(q.grad.masked_select(~rows) == 0)
    assert all(torch.all(g.masked_select(~keys) == 0) for g in (k.grad, v.grad))
    errors = {"o": rel(o * rows, ref * rows)}
    for name, got, want, real in (("dq", q.grad, qb.grad, rows), ("dk", k.grad, kb.grad, keys),
                                  ("dv", v.grad, vb.grad, keys)):
        errors[name] = rel(got * real, want.permute(0, 2, 1, 3) * real)
    assert errors["o"] < O_TOLERANCE, errors
    assert max(errors[n] for n in ("dq", "dk", "dv")) < GRAD_TOLERANCE, errors


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_the_hybrid_recipe_matches_float32_attention_with_e5m2_gradients(recipe):
    # E4M3 forward, dO, dP and the gradients in E5M2: the gradients' tolerance is E5M2's (one
    # mantissa bit less), as in the C++ check.
    state = fa.Fp8State(recipe, history=4, grad_dtype=torch.float8_e5m2)
    for step in range(3):
        q, k, v = inputs(seed=30 + step)
        d_o = (torch.rand_like(q) * 2 - 1) * 1e3  # beyond E4M3's range at scale 1: E5M2's is needed
        o = fa.fp8_attention(q, k, v, state, causal=True, backward="fp8")  # E5M2 gradients: cuDNN's FP8 backward
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
        fa.fp8_attention(q, k, v, state, causal=True, backward="fp8").backward(torch.ones_like(q))
    # backward="auto" (the default) takes the model's backward where cuDNN's FP8 one is refused.
    fa.fp8_attention(q, k, v, state, causal=True).backward(torch.ones_like(q))
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
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
