"""fusedattn.jax.fp8_attention's program exported for CUDA, without a GPU: the FFI calls' operands
in the order the handlers read them, the FP8 spec in the calls, the hybrid format's E5M2 backward,
the model-precision backward's BF16 call, and runtime lengths in both passes."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402

from fusedattn.jax._calls import BACKWARD, FORWARD  # noqa: E402
from loaded_cudnn import skip_if_refused_for_the_loaded_cudnn  # noqa: E402


def test_the_fp8_call_takes_its_scalars_last_and_returns_its_amaxes_last():
    from fusedattn import _config
    from fusedattn.jax._calls import Call
    call = Call(_config.config("bshd", causal=True), 0.125, fp8=True)
    assert call != Call(call.config, 0.125) and hash(call) == hash(Call(call.config, 0.125, fp8=True))
    assert call.inputs(FORWARD) == ("q", "k", "v", "descale_q", "descale_k", "descale_v", "descale_s", "scale_s",
                                    "scale_o")
    assert call.outputs(FORWARD) == ("o", "stats", "amax_s", "amax_o")
    assert call.inputs(BACKWARD) == ("q", "k", "v", "o", "stats", "d_o", "descale_q", "descale_k", "descale_v",
                                     "descale_o", "descale_d_o", "descale_s", "descale_d_p", "scale_s", "scale_d_p",
                                     "scale_d_q", "scale_d_k", "scale_d_v")
    assert call.outputs(BACKWARD) == ("d_q", "d_k", "d_v", "amax_d_q", "amax_d_k", "amax_d_v", "amax_d_p")


def exported_step(state, backward="fp8", lengths=False):
    """A jitted training step on a (2, 128, 4, 128) bfloat16 q (as k and v too) exported for CUDA:
    its module text, and its forward and backward custom calls' lines. lengths: with runtime
    lengths (seq_len_q, seq_len_kv: int32 [2])."""
    q = jax.ShapeDtypeStruct((2, 128, 4, 128), jnp.bfloat16)
    state = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    seq_len = jax.ShapeDtypeStruct((2,), jnp.int32)

    def step(q, state, seq_len):
        options = dict(seq_len_q=seq_len, seq_len_kv=seq_len) if lengths else {}
        return jax.grad(lambda q, state: fj.fp8_attention(q, q, q, state, causal=True, backward=backward,
                                                          **options)[0].astype(jnp.float32).sum(),
                        argnums=(0, 1))(q, state)
    ours = [jax.export.DisabledSafetyCheck.custom_call(name) for name in ("fusedattn_forward", "fusedattn_backward")]
    text = jax.export.export(jax.jit(step), platforms=["cuda"], disabled_checks=ours)(q, state, seq_len).mlir_module()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call @fusedattn_" in line]
    return (text, [line for line in calls if "@fusedattn_forward" in line],
            [line for line in calls if "@fusedattn_backward" in line])


def test_exported_for_cuda_the_step_calls_the_ffi_targets_with_the_fp8_spec():
    text, forward, backward = exported_step(fj.fp8_state("delayed"))
    assert "layout=bshd dtype=e4m3 b=2 s_q=128 s_kv=128 h_q=4 h_kv=4 d_qk=128 d_v=128 window=-1,0" in text
    assert len(forward) == 1 and len(backward) == 2  # the measuring backward, in a conditional
    # 3 FP8 arrays and 6 scalars in; O, the statistics, 2 amaxes and the workspace out.
    assert forward[0].count("tensor<f32>") == 6 + 2 and "f8E4M3FN" in forward[0]
    assert backward[0].count("tensor<f32>") == 12 + 4


def test_exported_for_cuda_the_hybrid_backward_takes_e5m2_and_says_so_in_its_spec():
    _, forward, backward = exported_step(fj.fp8_state("delayed", grad_dtype=jnp.float8_e5m2))
    assert "f8E4M3FN" in forward[0] and "f8E5M2" not in forward[0]
    assert backward and all("f8E5M2" in line and "fp8_grads=e5m2" in line for line in backward), backward


def test_exported_for_cuda_the_model_backward_calls_the_bf16_backward():
    text, forward, backward = exported_step(fj.fp8_state("delayed"), backward="model")
    assert len(forward) == 1 and "f8E4M3FN" in forward[0]  # the FP8 forward
    assert len(backward) == 1 and "f8E4M3FN" not in backward[0] and "bf16" in backward[0]  # one BF16 backward
    assert "layout=bshd dtype=bf16 b=2 s_q=128 s_kv=128 h_q=4 h_kv=4 d_qk=128 d_v=128 window=-1,0" in text


@pytest.mark.parametrize("backward", ["fp8", "model"])
def test_exported_for_cuda_runtime_lengths_come_after_the_arrays_in_both_passes(backward):
    """The lengths (int32 [2]) after q, k, v (and o, stats, d_o), before the FP8 scalars, as the
    handlers read them (Call.inputs), and the spec says padding=1. Tracing asks the support policy,
    with the loaded cuDNN where there is a GPU."""
    skip_if_refused_for_the_loaded_cudnn("layout=bshd dtype=e4m3 b=2 s=128 h=4 d=128 causal padding=1")
    text, forward, backward_calls = exported_step(fj.fp8_state("delayed"), backward=backward, lengths=True)
    assert "padding=1" in text
    for line in forward + backward_calls:
        operands = line.rsplit(" : (", 1)[1].split(") -> (")[0].split(", ")
        lengths = [i for i, t in enumerate(operands) if t == "tensor<2xi32>"]
        scalars = [i for i, t in enumerate(operands) if t == "tensor<f32>"]
        assert len(lengths) == 2 and all(i < min(scalars, default=len(operands)) for i in lengths), operands
        assert min(lengths) == (3 if "@fusedattn_forward" in line else 6), operands
