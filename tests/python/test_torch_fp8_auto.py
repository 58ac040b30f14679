"""fp8_attention's backward="auto" without a GPU: on meta tensors the policy decides (the FP8
backward unless it refuses the shape, then the model's), and with a stand-in for the core's
measurement the choice reaches the operators as the model_backward flag and the FP8 backward's
format, once per shape. Same gradients as the road chosen, on a GPU: test_torch_fp8_auto_gpu.py."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

import fusedattn  # noqa: E402
from fusedattn import InvalidArgumentError, _fp8_backward  # noqa: E402
from fusedattn.torch import _fp8, _fp8_auto, _fp8_operators  # noqa: E402
from meta_tensors import meta  # noqa: E402


@pytest.fixture
def operator_calls(monkeypatch):
    """The operator fp8_attention calls on meta tensors, standing in: records (model_backward, config)."""
    calls = []

    def attention(q, k, v, *, state, config, scale, model_backward, calibrated, seq_len_q=None, seq_len_kv=None):
        calls.append((model_backward, config))
        return q

    monkeypatch.setattr(_fp8_operators, "attention", attention)
    memo = _fp8_backward.chooses_model  # a test may replace it
    memo.cache_clear()
    yield calls
    memo.cache_clear()


def test_auto_is_the_default_and_other_values_are_refused():
    assert _fp8.fp8_attention.__kwdefaults__["backward"] == "auto"
    q = meta(2, 64, 4, 128)
    with pytest.raises(InvalidArgumentError, match='backward.*"auto", "fp8" or "model"'):
        fa.fp8_attention(q, q, q, fa.Fp8State(device="meta"), backward="fastest")


def test_without_a_gpu_auto_takes_fp8_where_the_policy_allows_it(operator_calls):
    q = meta(2, 64, 4, 128)
    fa.fp8_attention(q, q, q, fa.Fp8State("delayed", device="meta"), causal=True)
    assert operator_calls[-1][0] is False


def test_without_a_gpu_auto_takes_the_model_where_the_policy_refuses_fp8s_backward(operator_calls):
    ok, _ = fusedattn.check_support("layout=bshd dtype=e4m3 b=2 s=64 h=4 d=64 causal", "backward", device="sm90")
    assert not ok, "the SM 9.0 policy refuses the FP8 backward at d = 64"
    q = meta(2, 64, 4, 64)
    fa.fp8_attention(q, q, q, fa.Fp8State("delayed", device="meta"), causal=True)
    assert operator_calls[-1][0] is True


@pytest.mark.parametrize("chosen", ["fp8", "model"])
def test_a_measured_choice_takes_its_road_once_per_shape(monkeypatch, operator_calls, chosen):
    asked = []

    def choose(spec, model_dtype):
        asked.append((str(spec), model_dtype))
        return chosen, 1.0, 2.0

    monkeypatch.setattr(_fp8_backward.core, "choose_fp8_backward", choose)
    # Stand in for a GPU: the views of meta tensors, measured as if on device 0.
    monkeypatch.setattr(_fp8_auto, "_device_of", lambda q: 0)
    monkeypatch.setattr(_fp8_auto.torch.cuda, "device", lambda device: _NoDevice())
    state = fa.Fp8State("delayed", grad_dtype=torch.float8_e5m2, device="meta")  # hybrid
    q = meta(1, 64, 8, 128)
    kv = meta(1, 64, 2, 128)
    for _ in range(3):
        fa.fp8_attention(q, kv, kv, state, causal=True)
    assert len(asked) == 1, "asked once per shape"
    spec, model_dtype = asked[0]
    assert model_dtype == "bf16" and "e4m3" in spec and "fp8_grads=e5m2" in spec and "h_kv=2" in spec
    model_backward, config = operator_calls[-1]
    assert model_backward is (chosen == "model")
    assert ("fp8_grads=e5m2" in config) is (chosen == "fp8"), "the model backward has no FP8 gradient format"
    fa.fp8_attention(meta(2, 64, 8, 128), meta(2, 64, 2, 128), meta(2, 64, 2, 128), state, causal=True)
    assert len(asked) == 2, "another shape is asked again"


def test_explicit_backwards_ask_nothing(monkeypatch, operator_calls):
    monkeypatch.setattr(_fp8_backward, "chooses_model", None)  # any call would fail
    q = meta(2, 64, 4, 128)
    fa.fp8_attention(q, q, q, fa.Fp8State(device="meta"), backward="model")
    fa.fp8_attention(q, q, q, fa.Fp8State(device="meta"), backward="fp8")
    assert [c[0] for c in operator_calls] == [True, False]


class _NoDevice:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_check_support_reports_the_fp8_backward_choice():
    fp8 = "layout=bshd dtype=e4m3 b=3 s=192 h=4 d=128 causal"  # a shape no test measures
    assert fusedattn.check_support(fp8, "backward").fp8_backward == "not measured"
    assert fusedattn.check_support(fp8, "forward").fp8_backward == ""
    assert fusedattn.check_support("layout=bshd b=3 s=192 h=4 d=128", "backward").fp8_backward == ""
