"""fusedattn.torch.fp8_attention without a GPU: on meta tensors it goes through the registered
operators fusedattn::fp8_forward / fusedattn::fp8_backward, whose fake implementations give every
output's shape, strides and dtype; torch.compile(fullgraph=True) traces it in one graph, and
compiles once more on a fresh state's second call (the first call's backward measures: the
calibration flag); runtime lengths go through both passes and are checked by name. The operators
with CPU stand-in bodies: test_torch_fp8_operators.py; inputs already in FP8:
test_torch_fp8_inputs.py."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn import InvalidArgumentError, _fp8_recipe  # noqa: E402
from fusedattn.torch import _call_config  # noqa: E402
from meta_tensors import meta  # noqa: E402
from torch_blocks import Fp8Block  # noqa: E402


def test_a_state_on_meta_has_the_buffer_layout():
    state = fa.Fp8State("delayed", history=8, device="meta")
    assert state.buffer.device.type == "meta" and state.buffer.shape == (10 * (3 + 8),)
    assert state.scalars.shape == (10, 3) and state.histories.shape == (10, 8)
    assert state.calibrated is False


@pytest.mark.parametrize("layout, shape", [("bshd", (2, 64, 4, 128)), ("sbhd", (64, 2, 4, 128)),
                                           ("bhsd", (2, 4, 64, 128))])
@pytest.mark.parametrize("backward", ["fp8", "model"])
def test_outputs_and_gradients_follow_the_inputs(layout, shape, backward):
    state = fa.Fp8State("current", device="meta")
    q, k, v = meta(*shape), meta(*shape), meta(*shape)
    o = fa.fp8_attention(q, k, v, state, layout=layout, causal=True, backward=backward)
    assert o.shape == q.shape and o.dtype == q.dtype and o.device.type == "meta"
    o.sum().backward()
    for x in (q, k, v):
        assert x.grad.shape == x.shape and x.grad.dtype == x.dtype and x.grad.stride() == x.stride()
    assert state.calibrated is (backward == "fp8")  # an FP8 backward traced: the next one runs once


def test_packed_qkv_views_get_packed_strided_gradients():
    qkv = meta(2, 64, 3, 4, 128)
    q, k, v = qkv.unbind(2)
    fa.fp8_attention(q, k, v, fa.Fp8State(device="meta")).sum().backward()
    assert qkv.grad.shape == qkv.shape


def test_the_fakes_give_fp8_tensors_statistics_and_descales():
    q, k, v = meta(2, 64, 4, 128, grad=False), meta(2, 80, 2, 128, grad=False), meta(2, 80, 2, 64, grad=False)
    state = fa.Fp8State(dtype=torch.float8_e5m2, device="meta")
    config = _call_config.fp8_config_text(layout="bshd", causal=True, window=(-1, -1), align="top_left", fp8_grads="")
    options = state.options.text  # "delayed 0 e5m2"
    o, q8, k8, v8, o8, stats, used = torch.ops.fusedattn.fp8_forward(q, k, v, state.buffer, options, config, 0.125)
    assert o.shape == (2, 64, 4, 64) and o.dtype == torch.bfloat16
    assert (q8.shape, k8.shape, v8.shape, o8.shape) == (q.shape, k.shape, v.shape, o.shape)
    assert {t.dtype for t in (q8, k8, v8, o8)} == {torch.float8_e5m2}
    assert stats.shape == (2, 4, 64) and stats.dtype == torch.float32
    assert used.shape == (4,) and used.dtype == torch.float32
    grads = torch.ops.fusedattn.fp8_backward(o, q8, k8, v8, o8, stats, used, q, state.buffer, options, config, 0.125,
                                             calibrated=False)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert {g.dtype for g in grads} == {torch.bfloat16}


def test_the_hybrid_state_has_e4m3_forward_and_e5m2_gradient_scales():
    state = fa.Fp8State("delayed", grad_dtype=torch.float8_e5m2, device="cpu")
    assert state.name == "hybrid" and state.dtype == torch.float8_e4m3fn and state.grad_dtype == torch.float8_e5m2
    assert state.scalars[_fp8_recipe.SLOT["s"], 0].item() == 448.0  # the probabilities: the forward's format
    config = _call_config.fp8_config_text(layout="bshd", causal=True, window=(-1, -1), align="top_left",
                                           fp8_grads="e5m2")
    assert "fp8_grads=e5m2" in config
    with pytest.raises(InvalidArgumentError) as caught:
        fa.Fp8State(dtype=torch.float8_e5m2, grad_dtype=torch.float8_e4m3fn, device="meta")
    assert caught.value.field == "grad_dtype"
    with pytest.raises(InvalidArgumentError) as caught:
        fa.Fp8State(grad_dtype=torch.bfloat16, device="meta")
    assert caught.value.field == "grad_dtype"


def test_tracing_meets_bad_input_as_eager_calls_do():
    state = fa.Fp8State(device="meta")
    q = meta(2, 64, 4, 128)
    with pytest.raises(InvalidArgumentError) as caught:
        fa.fp8_attention(q, meta(2, 64, 4, 64), q, state)
    assert (caught.value.field, caught.value.requirement) == ("d_qk", "k's head dim equal to q's (128)")
    with pytest.raises(InvalidArgumentError) as caught:
        fa.fp8_attention(q.float(), q.float(), q.float(), state)
    assert caught.value.field == "q.dtype"
    with pytest.raises(InvalidArgumentError) as caught:
        fa.fp8_attention(q, q, q, state, backward="fp16")
    assert caught.value.field == "backward"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("backward", ["fp8", "model"])
def test_compiles_in_one_graph_and_once_more_after_calibration(backend, backward):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    block = Fp8Block(backward=backward).to(device="meta", dtype=torch.bfloat16)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    for _ in range(3):
        x = torch.empty(2, 64, 256, device="meta", dtype=torch.bfloat16, requires_grad=True)
        y = compiled(x)
        y.sum().backward()
        assert y.shape == x.shape and y.dtype == x.dtype and x.grad.shape == x.shape
        assert block.qkv.weight.grad.shape == block.qkv.weight.shape
    assert not counters["graph_break"]
    # The first graph's backward measures; the flag it set makes the second call compile once more.
    assert counters["stats"]["unique_graphs"] == (2 if backward == "fp8" else 1)
    assert block.state.calibrated is (backward == "fp8")


def test_compiled_calls_see_the_flag_as_traced():
    state = fa.Fp8State(device="meta")
    state.calibrated = True  # e.g. measured by an eager step first: no second compilation
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(lambda q, k, v: fa.fp8_attention(q, k, v, state).sum(), fullgraph=True, backend="aot_eager")
    for _ in range(2):
        step(meta(2, 64, 4, 128), meta(2, 64, 4, 128), meta(2, 64, 4, 128)).backward()
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("backward", ["fp8", "model"])
def test_runtime_lengths_go_through_both_passes(backward):
    state = fa.Fp8State(device="meta")
    q, k, v = meta(2, 64, 4, 128), meta(2, 96, 4, 128), meta(2, 96, 4, 128)
    lengths = dict(seq_len_q=torch.empty(2, dtype=torch.int32, device="meta"),
                   seq_len_kv=torch.empty(2, dtype=torch.int32, device="meta"))
    o = fa.fp8_attention(q, k, v, state, backward=backward, **lengths)
    assert o.shape == q.shape and o.dtype == q.dtype
    o.sum().backward()
    assert [x.grad.shape for x in (q, k, v)] == [q.shape, k.shape, v.shape]


def test_runtime_lengths_compile_in_one_graph():
    torch._dynamo.reset()
    state = fa.Fp8State(device="meta")
    step = torch.compile(lambda q, k, v, a, b: fa.fp8_attention(q, k, v, state, backward="fp8", seq_len_q=a,
                                                                seq_len_kv=b), fullgraph=True, backend="eager")
    q = meta(2, 64, 4, 128)
    lengths = [torch.empty(2, dtype=torch.int32, device="meta") for _ in range(2)]
    step(q, q, q, *lengths).sum().backward()
    assert q.grad.shape == q.shape


@pytest.mark.parametrize("given, field", [
    (dict(seq_len_q=(2, torch.int32)), "seq_len_q"),
    (dict(seq_len_q=(2, torch.int32), seq_len_kv=(2, torch.int64)), "seq_len_kv.dtype"),
    (dict(seq_len_q=(3, torch.int32), seq_len_kv=(2, torch.int32)), "seq_len_q.shape"),
], ids=["one-without-the-other", "int64", "a-length-too-many"])
def test_runtime_lengths_are_checked_by_name(given, field):
    q = meta(2, 64, 4, 128)
    lengths = {name: torch.empty(n, dtype=dtype, device="meta") for name, (n, dtype) in given.items()}
    with pytest.raises(InvalidArgumentError) as caught:
        fa.fp8_attention(q, q, q, fa.Fp8State(device="meta"), backward="fp8", **lengths)
    assert caught.value.field == field
