"""fusedattn.torch.fp8_attention without a GPU: on meta tensors it goes through the registered
operators fusedattn::fp8_forward / fusedattn::fp8_backward, whose fake implementations give every
output's shape, strides and dtype; torch.compile(fullgraph=True) traces it in one graph, and
compiles once more on a fresh state's second call (the first call's backward measures: the
calibration flag). The operators' bodies need CUDA, so opcheck and the checks of what compiled code
does with the state run here with CPU stand-in bodies: they test the schemas, the declared mutation,
the fakes under dynamic shapes, the state's updates reaching its buffer and the gradients' wiring,
not the bodies' numerics."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn import InvalidArgumentError, _config, _fp8_recipe  # noqa: E402
from fusedattn.torch import _call_config, _fp8_bodies, _fp8_operators, _fp8_state  # noqa: E402


def meta(*shape, dtype=torch.bfloat16, grad=True):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


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
    o, q8, k8, v8, o8, stats, used = torch.ops.fusedattn.fp8_forward(q, k, v, state.buffer, config, 0.125, "delayed",
                                                                     0, "e5m2")
    assert o.shape == (2, 64, 4, 64) and o.dtype == torch.bfloat16
    assert (q8.shape, k8.shape, v8.shape, o8.shape) == (q.shape, k.shape, v.shape, o.shape)
    assert {t.dtype for t in (q8, k8, v8, o8)} == {torch.float8_e5m2}
    assert stats.shape == (2, 4, 64) and stats.dtype == torch.float32
    assert used.shape == (4,) and used.dtype == torch.float32
    grads = torch.ops.fusedattn.fp8_backward(o, q8, k8, v8, o8, stats, used, q, state.buffer, config, 0.125,
                                             "delayed", 0, "e5m2", calibrated=False)
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


class Block(torch.nn.Module):
    """Head dim 128: Hopper's FP8 backward takes no other (test_torch_fp8_gpu.py runs it too)."""

    def __init__(self, dim=256, heads=2, backward="fp8", state=None):
        super().__init__()
        self.heads, self.backward = heads, backward
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.state = state or fa.Fp8State("delayed", history=4, device="meta")

    def forward(self, x):
        b, s, dim = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, dim // self.heads).unbind(2)
        o = fa.fp8_attention(q, k, v, self.state, causal=True, backward=self.backward)
        return x + self.out(o.reshape(b, s, dim))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("backward", ["fp8", "model"])
def test_compiles_in_one_graph_and_once_more_after_calibration(backend, backward):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    block = Block(backward=backward).to(device="meta", dtype=torch.bfloat16)
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


@pytest.fixture
def stand_in_bodies(monkeypatch):
    """CPU stand-ins for the CUDA bodies: outputs of the fakes' shapes and dtypes, the state written
    the way the bodies write it (in place), and a record of the calibration flag each backward got."""
    backwards = []

    def forward(q, k, v, buffer, config, scale, recipe, margin, name):
        buffer[0] += 1
        fp8 = _fp8_state.FORMATS[name][0]
        o = q * 2
        stats = torch.zeros(_config.output_shapes(_config.parse(config), _config.FORWARD, q, k, v)["stats"],
                            dtype=torch.float32)
        return o, q.to(fp8), k.to(fp8), v.to(fp8), o.to(fp8), stats, buffer[:4].clone()

    def backward(d_o, q8, k8, v8, o8, stats, used, like, buffer, config, scale, recipe, margin, name, calibrated):
        backwards.append(calibrated)
        buffer[1] += 1
        return d_o * 2, d_o * 3, d_o * 4

    monkeypatch.setattr(_fp8_bodies, "forward", forward)
    monkeypatch.setattr(_fp8_bodies, "backward", backward)
    return backwards


def call(q, k, v, state):
    config = _call_config.fp8_config_text(layout="bshd", causal=False, window=(-1, -1), align="top_left", fp8_grads="")
    return _fp8_operators.attention(q, k, v, buffer=state.buffer, config=config, scale=0.125, recipe=state.recipe,
                                    margin=state.margin, name=state.name, model_backward=False,
                                    calibrated=state.calibrated)


def test_opcheck_with_stand_in_bodies(stand_in_bodies):
    q = torch.randn(2, 16, 2, 32, dtype=torch.bfloat16)
    buffer = fa.Fp8State(device="cpu").buffer
    config = _call_config.fp8_config_text(layout="bshd", causal=False, window=(-1, -1), align="top_left", fp8_grads="")
    torch.library.opcheck(torch.ops.fusedattn.fp8_forward.default, (q, q, q, buffer, config, 0.125, "delayed", 0,
                                                                     "e4m3"))
    o, _, _, _, _, stats, used = torch.ops.fusedattn.fp8_forward(q, q, q, buffer, config, 0.125, "delayed", 0, "e4m3")
    # bf16 where the FP8 tensors go: SchemaCheckMode compares inputs before and after with a CPU mul
    # that float8 lacks, and the schema takes any dtype.
    torch.library.opcheck(torch.ops.fusedattn.fp8_backward.default,
                          (o, q, q, q, o, stats, used, q, buffer, config, 0.125, "delayed", 0, "e4m3"),
                          {"calibrated": True})


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_state_updates_reach_the_buffer(stand_in_bodies, backend):
    torch._dynamo.reset()
    state = fa.Fp8State(device="cpu", history=2)
    step = torch.compile(call, fullgraph=True, backend=backend)
    for _ in range(2):
        q, k = (torch.randn(2, 16, 2, 32, requires_grad=True) for _ in range(2))
        step(q, k, k, state).sum().backward()
        # The slots' gradients accumulate as in eager, even with one tensor in two of them.
        assert torch.equal(q.grad, torch.full_like(q, 2)) and torch.equal(k.grad, torch.full_like(k, 7))
    assert state.buffer[0].item() == 1 + 2 and state.buffer[1].item() == 1 + 2  # both forwards, both backwards
    assert stand_in_bodies == [False, False]  # the flag as traced: `call` does not set it, fp8_attention does


def test_aot_autograd_refuses_a_forward_between_a_compiled_forward_and_its_backward(stand_in_bodies):
    """The limit _fp8_operators.py's docstring states (PyTorch 2.11 checks the buffer's version)."""
    torch._dynamo.reset()
    state = fa.Fp8State(device="cpu")
    step = torch.compile(call, fullgraph=True, backend="aot_eager")
    q = torch.randn(2, 16, 2, 32, requires_grad=True)
    first = step(q, q, q, state)
    step(q, q, q, state)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        first.sum().backward()


# --- inputs already in FP8 (forward only) ------------------------------------------------------------

def fp8_inputs(shape=(2, 64, 4, 128), dtype=torch.float8_e4m3fn):
    q, k, v = (meta(*shape, dtype=dtype, grad=False) for _ in range(3))
    return q, k, v, tuple(torch.empty(1, device="meta") for _ in range(3))


@pytest.mark.parametrize("out_dtype", [None, torch.float16, torch.float8_e4m3fn])
def test_fp8_inputs_give_o_in_the_asked_dtype(out_dtype):
    q, k, v, descales = fp8_inputs()
    out = fa.fp8_attention(q, k, v, fa.Fp8State(device="meta"), causal=True, descales=descales, out_dtype=out_dtype)
    if out_dtype == torch.float8_e4m3fn:
        o8, descale_o = out
        assert o8.dtype == torch.float8_e4m3fn and o8.shape == q.shape and descale_o.shape == (1,)
    else:
        assert out.dtype == (out_dtype or torch.bfloat16) and out.shape == q.shape


def test_fp8_inputs_compile_in_one_graph():
    q, k, v, descales = fp8_inputs()
    state = fa.Fp8State(device="meta")
    compiled = torch.compile(lambda q, k, v: fa.fp8_attention(q, k, v, state, causal=True, descales=descales),
                             fullgraph=True, backend="eager")
    assert compiled(q, k, v).shape == q.shape


@pytest.mark.parametrize("change, field", [
    (dict(descales=None), "descales"),
    (dict(descales=(torch.empty(1, device="meta"),) * 2), "descales"),
    (dict(descales=(torch.empty(2, device="meta"),) * 3), "descales.descale_q"),
    (dict(descales=(torch.empty(1, device="meta", dtype=torch.float16),) * 3), "descales.descale_q"),
    (dict(out_dtype=torch.float32), "out_dtype"),
])
def test_fp8_inputs_refuse_bad_arguments_naming_the_field(change, field):
    q, k, v, descales = fp8_inputs()
    kwargs = dict(descales=descales, **change) if "descales" not in change else change
    with pytest.raises(InvalidArgumentError) as caught:
        fa.fp8_attention(q, k, v, fa.Fp8State(device="meta"), **kwargs)
    assert caught.value.field == field


def test_plain_fp8_inputs_must_be_the_states_format_and_need_no_gradient():
    q, k, v, descales = fp8_inputs(dtype=torch.float8_e5m2)
    with pytest.raises(InvalidArgumentError) as caught:
        fa.fp8_attention(q, k, v, fa.Fp8State(device="meta"), descales=descales)  # an E4M3 state
    assert caught.value.field == "q.dtype"
    q, k, v, descales = fp8_inputs()
    with pytest.raises(InvalidArgumentError) as caught:
        fa.fp8_attention(q, k, v.requires_grad_(), fa.Fp8State(device="meta"), descales=descales)
    assert caught.value.field == "v.requires_grad" and "Fp8Tensor" in caught.value.requirement
    with pytest.raises(InvalidArgumentError) as caught:  # descales belong to FP8 inputs
        fa.fp8_attention(*(meta(2, 64, 4, 128) for _ in range(3)), fa.Fp8State(device="meta"), descales=descales)
    assert caught.value.field == "descales"


# --- Fp8Tensors: inputs already in FP8, differentiable -----------------------------------------------

def fp8_tensors(shape=(2, 64, 4, 128), device="meta", dtype=torch.float8_e4m3fn, grad=True):
    return [fa.Fp8Tensor(torch.empty(*shape, device=device, dtype=dtype), torch.ones(1, device=device),
                         torch.bfloat16, requires_grad=grad) for _ in range(3)]


def test_an_fp8_tensor_is_its_value_to_every_other_operation():
    data = torch.tensor([[1.0, -2.0], [0.5, 448.0]]).to(torch.float8_e4m3fn)
    x = fa.Fp8Tensor(data, torch.tensor([0.25]), torch.float16)
    assert x.dtype == torch.float16 and x.shape == (2, 2) and x.data8 is data
    want = torch.tensor([[0.25, -0.5], [0.125, 112.0]], dtype=torch.float16)
    assert torch.equal(x.dequantize(), want) and torch.equal(x + 0, want) and type(x + 0) is torch.Tensor
    assert type(x.detach()) is fa.Fp8Tensor and x.detach().data8.data_ptr() == data.data_ptr()
    assert "float8_e4m3fn" in repr(x)


@pytest.mark.parametrize("make, field", [
    (lambda: fa.Fp8Tensor(torch.zeros(2), torch.ones(1)), "data"),
    (lambda: fa.Fp8Tensor(torch.zeros(2, dtype=torch.float8_e4m3fn), torch.ones(2)), "descale"),
    (lambda: fa.Fp8Tensor(torch.zeros(2, dtype=torch.float8_e4m3fn), torch.ones(1, dtype=torch.float16)), "descale"),
    (lambda: fa.Fp8Tensor(torch.zeros(2, dtype=torch.float8_e4m3fn), 0.5), "descale"),
    (lambda: fa.Fp8Tensor(torch.zeros(2, dtype=torch.float8_e4m3fn), torch.ones(1), torch.float32), "dtype"),
    (lambda: fa.fp8_quantize(torch.zeros(2)), "x.dtype"),
    (lambda: fa.fp8_quantize(torch.zeros(2, dtype=torch.bfloat16), torch.bfloat16), "dtype"),
])
def test_fp8_tensors_refuse_bad_parts_naming_the_field(make, field):
    with pytest.raises(InvalidArgumentError) as caught:
        make()
    assert caught.value.field == field


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_quantize_scales_to_the_formats_largest_value_and_passes_the_gradient_through(dtype):
    x = (torch.randn(64, 32) * 3).to(torch.bfloat16).requires_grad_()
    q = fa.fp8_quantize(x, dtype)
    assert type(q) is fa.Fp8Tensor and q.data8.dtype == dtype and q.dtype == torch.bfloat16
    largest = torch.finfo(dtype).max
    assert q.data8.float().abs().max().item() == largest  # the amax maps onto the largest value
    assert q.descale.item() == pytest.approx(x.detach().float().abs().max().item() / largest, rel=1e-6)
    mantissa = 3 if dtype == torch.float8_e4m3fn else 2
    error = (q.dequantize().float() - x.detach().float()).abs() / x.detach().float().abs().clamp_min(1e-3)
    assert error[x.detach().float().abs() > 1e-2 * largest * q.descale].max() <= 2.0 ** -(mantissa + 1) + 1e-2
    upstream = torch.randn(64, 32, dtype=torch.bfloat16)
    (q * upstream).sum().backward()
    assert torch.equal(x.grad, upstream)  # straight through
    zero = fa.fp8_quantize(torch.zeros(4, dtype=torch.bfloat16), dtype)
    assert zero.descale.item() == 1.0 and torch.equal(zero.dequantize(), torch.zeros(4, dtype=torch.bfloat16))


@pytest.mark.parametrize("backward", ["fp8", "model"])
def test_fp8_tensors_have_gradients_in_their_dtype(backward):
    state = fa.Fp8State("current", device="meta")
    q, k, v = fp8_tensors()
    o = fa.fp8_attention(q, k, v, state, causal=True, backward=backward)
    assert type(o) is torch.Tensor and o.dtype == torch.bfloat16 and o.shape == q.shape
    o.sum().backward()
    for x in (q, k, v):
        assert type(x.grad) is torch.Tensor and x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape
    assert state.calibrated is (backward == "fp8")


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_fp8_tensors_compile_in_one_graph(backend):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    state = fa.Fp8State("delayed", history=4, device="meta")
    state.calibrated = True

    def step(x, k, v):
        return fa.fp8_attention(fa.fp8_quantize(x), k, v, state, causal=True).sum()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    for _ in range(2):
        x = torch.empty(2, 64, 4, 128, device="meta", dtype=torch.bfloat16, requires_grad=True)
        _, k, v = fp8_tensors()
        compiled(x, k, v).backward()
        assert x.grad.shape == x.shape and x.grad.dtype == torch.bfloat16 and k.grad.dtype == torch.bfloat16
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1


def test_fp8_tensors_refuse_what_does_not_fit_naming_the_field():
    state = fa.Fp8State(device="meta")
    q, k, v = fp8_tensors()
    cases = [
        (dict(args=(q, meta(2, 64, 4, 128), v)), "k"),
        (dict(args=(q, k, fp8_tensors(dtype=torch.float8_e5m2)[2])), "v.data8.dtype"),
        (dict(args=(q, k, fa.Fp8Tensor(v.data8, v.descale, torch.float16))), "v.dtype"),
        (dict(args=(q, k, v), descales=tuple(torch.ones(1, device="meta") for _ in range(3))), "descales"),
        (dict(args=(q, k, v), out_dtype=torch.float8_e4m3fn), "out_dtype"),
    ]
    for case, field in cases:
        with pytest.raises(InvalidArgumentError) as caught:
            fa.fp8_attention(*case.pop("args"), state, **case)
        assert caught.value.field == field


@pytest.fixture
def stand_in_fp8_inputs_bodies(monkeypatch):
    """CPU stand-ins for the FP8-input forward and the FP8 backward: O = 2 * the values of V, and
    gradients 1, 2 and 3 times dO, so the gradients' wiring shows."""

    def forward(q8, k8, v8, descale_q, descale_k, descale_v, buffer, config, scale, recipe, margin, name, out_dtype):
        o = (v8.float() * descale_v * 2).to(out_dtype)
        stats = torch.zeros(_config.output_shapes(_config.parse(config), _config.FORWARD, q8, k8, v8)["stats"],
                            dtype=torch.float32)
        return v8.clone(), o, stats, torch.cat([descale_q, descale_k, descale_v, descale_v])

    def backward(d_o, q8, k8, v8, o8, stats, used, like, buffer, config, scale, recipe, margin, name, calibrated):
        return (d_o * 1).to(like.dtype), (d_o * 2).to(like.dtype), (d_o * 3).to(like.dtype)

    monkeypatch.setattr(_fp8_bodies, "fp8_inputs_forward", forward)
    monkeypatch.setattr(_fp8_bodies, "backward", backward)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_fp8_tensors_take_their_gradients_through_quantizing(stand_in_fp8_inputs_bodies, backend):
    torch._dynamo.reset()
    state = fa.Fp8State(device="cpu")
    state.calibrated = True
    config = _call_config.fp8_config_text(layout="bshd", causal=False, window=(-1, -1), align="top_left", fp8_grads="")

    def call(x, k, v):  # fp8_attention's road 3 past its check of the device
        return _fp8_operators.fp8_tensor_attention(fa.fp8_quantize(x), k, v, buffer=state.buffer, config=config,
                                                   scale=0.125, recipe=state.recipe, margin=state.margin,
                                                   name=state.name, model_backward=False, calibrated=True)

    step = torch.compile(call, fullgraph=True, backend=backend)
    x = torch.randn(2, 16, 2, 32, dtype=torch.bfloat16, requires_grad=True)
    k, v = fp8_tensors((2, 16, 2, 32), device="cpu")[1:]
    v.data8.copy_(torch.randn(2, 16, 2, 32).to(torch.float8_e4m3fn))
    o = step(x, k, v)
    assert torch.equal(o, (v.data8.float() * 2).to(torch.bfloat16))
    o.backward(torch.ones_like(o))
    assert torch.equal(x.grad, torch.ones_like(x))  # through fp8_quantize's straight-through gradient
    assert torch.equal(k.grad, torch.full_like(x, 2)) and torch.equal(v.grad, torch.full_like(x, 3))
