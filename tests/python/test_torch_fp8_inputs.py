"""fusedattn.torch.fp8_attention on inputs already in FP8, without a GPU: plain FP8 tensors with their
descales (forward only) and Fp8Tensors (differentiable, fp8_quantize's straight-through gradient), on
meta tensors and, for what compiled code does with their gradients, with CPU stand-in bodies; the
arguments refused, naming the field."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn import InvalidArgumentError, _config  # noqa: E402
from fusedattn.torch import _call_config, _fp8_bodies, _fp8_operators  # noqa: E402
from meta_tensors import meta  # noqa: E402


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

    def forward(q8, k8, v8, descale_q, descale_k, descale_v, scaling, config, scale, out_dtype, seq_len_q=None,
                seq_len_kv=None):
        o = (v8.float() * descale_v * 2).to(out_dtype)
        stats = torch.zeros(_config.output_shapes(_config.parse(config), _config.FORWARD, q8, k8, v8)["stats"],
                            dtype=torch.float32)
        return v8.clone(), o, stats, torch.cat([descale_q, descale_k, descale_v, descale_v])

    def backward(d_o, q8, k8, v8, o8, stats, used, like, scaling, config, scale, calibrated, seq_len_q=None,
                 seq_len_kv=None):
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
        return _fp8_operators.fp8_tensor_attention(fa.fp8_quantize(x), k, v, state=state, config=config,
                                                   scale=0.125, model_backward=False, calibrated=True)

    step = torch.compile(call, fullgraph=True, backend=backend)
    x = torch.randn(2, 16, 2, 32, dtype=torch.bfloat16, requires_grad=True)
    k, v = fp8_tensors((2, 16, 2, 32), device="cpu")[1:]
    v.data8.copy_(torch.randn(2, 16, 2, 32).to(torch.float8_e4m3fn))
    o = step(x, k, v)
    assert torch.equal(o, (v.data8.float() * 2).to(torch.bfloat16))
    o.backward(torch.ones_like(o))
    assert torch.equal(x.grad, torch.ones_like(x))  # through fp8_quantize's straight-through gradient
    assert torch.equal(k.grad, torch.full_like(x, 2)) and torch.equal(v.grad, torch.full_like(x, 3))
