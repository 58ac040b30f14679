"""fusedattn.torch's FP8 operators without a GPU: their bodies need CUDA, so opcheck and the checks of
what compiled code does with the state run here with CPU stand-in bodies: they test the schemas, the
declared mutation, the fakes under dynamic shapes, the state's updates reaching its buffer and the
gradients' wiring, not the bodies' numerics."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn import _config  # noqa: E402
from fusedattn.torch import _call_config, _fp8_bodies, _fp8_operators, _fp8_state  # noqa: E402


@pytest.fixture
def stand_in_bodies(monkeypatch):
    """CPU stand-ins for the CUDA bodies: outputs of the fakes' shapes and dtypes, the state written
    the way the bodies write it (in place), and a record of the calibration flag each backward got."""
    backwards = []

    def forward(q, k, v, scaling, config, scale, seq_len_q=None, seq_len_kv=None):
        buffer = scaling.histories  # any part of the state's buffer, to see the writes reach it
        buffer[0, 0] += 1
        fp8 = scaling.dtype
        o = q * 2
        stats = torch.zeros(_config.output_shapes(_config.parse(config), _config.FORWARD, q, k, v)["stats"],
                            dtype=torch.float32)
        return o, q.to(fp8), k.to(fp8), v.to(fp8), o.to(fp8), stats, torch.ones(4)

    def backward(d_o, q8, k8, v8, o8, stats, used, like, scaling, config, scale, calibrated, seq_len_q=None,
                 seq_len_kv=None):
        backwards.append(calibrated)
        scaling.histories[0, 1] += 1
        return d_o * 2, d_o * 3, d_o * 4

    monkeypatch.setattr(_fp8_bodies, "forward", forward)
    monkeypatch.setattr(_fp8_bodies, "backward", backward)
    return backwards


def call(q, k, v, state):
    config = _call_config.fp8_config_text(layout="bshd", causal=False, window=(-1, -1), align="top_left", fp8_grads="")
    return _fp8_operators.attention(q, k, v, state=state, config=config, scale=0.125, model_backward=False,
                                    calibrated=state.calibrated)


def test_opcheck_with_stand_in_bodies(stand_in_bodies):
    q = torch.randn(2, 16, 2, 32, dtype=torch.bfloat16)
    state = fa.Fp8State(device="cpu")
    buffer, options = state.buffer, state.options.text
    config = _call_config.fp8_config_text(layout="bshd", causal=False, window=(-1, -1), align="top_left", fp8_grads="")
    torch.library.opcheck(torch.ops.fusedattn.fp8_forward.default, (q, q, q, buffer, options, config, 0.125))
    o, _, _, _, _, stats, used = torch.ops.fusedattn.fp8_forward(q, q, q, buffer, options, config, 0.125)
    # bf16 where the FP8 tensors go: SchemaCheckMode compares inputs before and after with a CPU mul
    # that float8 lacks, and the schema takes any dtype.
    torch.library.opcheck(torch.ops.fusedattn.fp8_backward.default,
                          (o, q, q, q, o, stats, used, q, buffer, options, config, 0.125),
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
    assert state.histories[0, 0].item() == 2 and state.histories[0, 1].item() == 2  # both forwards, both backwards
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


def test_runtime_lengths_reach_both_bodies_through_the_operators(monkeypatch):
    """The lengths the forward got are the ones its backward gets, in eager autograd and compiled code
    alike (the bodies are stand-ins: their tensors are recorded, not read)."""
    seen = []

    def forward(q, k, v, scaling, config, scale, seq_len_q=None, seq_len_kv=None):
        seen.append(("forward", seq_len_q, seq_len_kv, _config.parse(config).padding))
        stats = torch.zeros(_config.output_shapes(_config.parse(config), _config.FORWARD, q, k, v)["stats"])
        return q * 2, q.to(scaling.dtype), k.to(scaling.dtype), v.to(scaling.dtype), q.to(scaling.dtype), stats, \
            torch.ones(4)

    def backward(d_o, q8, k8, v8, o8, stats, used, like, scaling, config, scale, calibrated, seq_len_q=None,
                 seq_len_kv=None):
        seen.append(("backward", seq_len_q, seq_len_kv, _config.parse(config).padding))
        return d_o * 1, d_o * 2, d_o * 3

    monkeypatch.setattr(_fp8_bodies, "forward", forward)
    monkeypatch.setattr(_fp8_bodies, "backward", backward)
    config = _call_config.fp8_config_text(layout="bshd", causal=False, window=(-1, -1), align="top_left", fp8_grads="",
                                          padding=True)
    lengths = dict(seq_len_q=torch.tensor([16, 3], dtype=torch.int32),
                   seq_len_kv=torch.tensor([9, 16], dtype=torch.int32))
    state = fa.Fp8State(device="cpu")

    def call(q):
        return _fp8_operators.attention(q, q, q, state=state, config=config, scale=0.125, model_backward=False,
                                        calibrated=True, **lengths)
    for step in (call, torch.compile(call, fullgraph=True, backend="aot_eager")):
        seen.clear()
        q = torch.randn(2, 16, 2, 32, requires_grad=True)
        step(q).sum().backward()
        assert [entry[0] for entry in seen] == ["forward", "backward"]
        for _, seq_len_q, seq_len_kv, padding in seen:
            assert padding and torch.equal(seq_len_q, lengths["seq_len_q"]) and \
                torch.equal(seq_len_kv, lengths["seq_len_kv"])
