"""What fusedattn answers without a GPU: support from the policy (for a named device, or for SM 9.0
where the process has no GPU), CUDA failures that say the driver or the GPU is missing, and
fusedattn.jax refusing arrays on the CPU in its own words before XLA's compiler would."""
import ctypes

import pytest

import fusedattn

NO_GPU = "\nGPU: none" in fusedattn.build_info()
needs_no_gpu = pytest.mark.skipif(not NO_GPU, reason="a CUDA GPU is present: check_support asks cuDNN there")


def driver_loads():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


MLA = "layout=bshd b=1 s=64 h=2 d_qk=192 d_v=128"  # trains on Hopper, and on SM 10.x from cuDNN 9.11


def test_a_named_device_gets_the_policy_for_it_and_says_cudnn_did_not_check():
    for device, trains in (("sm80", False), ("sm90", True), ("sm100", True), ("sm_120", False)):
        answer = fusedattn.check_support(MLA, "backward", device=device)
        ok, reasons = answer
        assert ok is trains and answer.ok is trains, str(answer)
        assert answer.reasons == reasons and bool(reasons) is not trains
        assert "cuDNN's own check not run" in answer.policy_only
        assert f"device {device} named" in answer.policy_only
        assert str(answer).endswith(f"({answer.policy_only})")
    ok, reasons = fusedattn.check_support(MLA, "backward", device="sm80")
    assert reasons[0][:2] == ("d_qk", "192") and reasons[0][3] == "a Hopper (SM 9.0) GPU"
    assert "SM 10.0" in fusedattn.check_support(MLA, device="sm100").policy_only


def test_a_bad_device_is_named():
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fusedattn.check_support(MLA, device="hopper")
    assert (caught.value.field, caught.value.value) == ("device", "hopper")
    assert "sm90" in caught.value.requirement
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fusedattn.check_support("layout=bshd b=1 s=64 h=2 d=60", device="sm90")  # the spec is validated too
    assert caught.value.field == "d_qk"


@needs_no_gpu
def test_without_a_gpu_the_answer_is_the_policy_for_sm90_saying_why():
    spec = "layout=bshd b=1 s_q=64 s_kv=32 h=2 d=512 causal align=bottom_right"
    answer = fusedattn.check_support(spec, "backward")
    assert answer == fusedattn.check_support(spec, "backward", device="sm90")  # (ok, reasons) alike
    assert not answer.ok and {field for field, *_ in answer.reasons} >= {"d_qk", "d_v", "align"}
    missing = "no NVIDIA driver found" if not driver_loads() else "no CUDA GPU found"
    assert answer.policy_only.startswith("policy for SM 9.0 with cuDNN ")
    assert answer.policy_only.endswith(f"cuDNN's own check not run ({missing})")
    tensor = ("bfloat16", (1, 64, 2, 64), (8192, 128, 64, 1))
    validated = fusedattn.Config("bshd", causal=True).spec(tensor, tensor, tensor)  # the ValidatedSpec path
    assert fusedattn.check_support(validated).ok
    assert fusedattn.check_support(validated).policy_only == answer.policy_only


@needs_no_gpu
def test_without_a_gpu_cuda_failures_say_what_is_missing():
    missing = "no NVIDIA driver found" if not driver_loads() else "no CUDA GPU found"
    with pytest.raises(fusedattn.CudaError) as caught:
        fusedattn.get_plan(fusedattn.Spec.parse("layout=bshd b=1 s=64 h=2 d=64"), fusedattn.Pass.forward)
    assert str(caught.value).startswith(f"cudaGetDevice failed: {missing} (")
    assert "insufficient" not in str(caught.value)
    assert f"GPU: none (cudaGetDeviceCount failed: {missing}" in fusedattn.build_info()


def jax_on_cpu():
    """fusedattn.jax, jax, and a function making bfloat16 arrays on the host's CPU device (there on
    machines with a GPU too, so these tests run everywhere)."""
    jax = pytest.importorskip("jax", reason="JAX not installed")
    fj = pytest.importorskip("fusedattn.jax")
    pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (no jax at configure)")
    cpu = jax.devices("cpu")[0]
    return jax, fj, lambda *shape: jax.device_put(jax.numpy.ones(shape, jax.numpy.bfloat16), cpu)


def refuses_cpu(call):
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        call()
    assert (caught.value.field, caught.value.value) == ("q.device", "cpu")
    assert "fusedattn.jax needs a CUDA device" in str(caught.value)


def test_jax_calls_on_cpu_arrays_say_they_need_a_cuda_device():
    jax, fj, array = jax_on_cpu()
    jnp = jax.numpy
    q = array(1, 64, 2, 64)
    refuses_cpu(lambda: fj.attention(q, q, q, causal=True))
    refuses_cpu(lambda: jax.jit(lambda q: fj.attention(q, q, q))(q))
    refuses_cpu(lambda: jax.grad(lambda q: fj.attention(q, q, q).astype(jnp.float32).sum())(q))
    refuses_cpu(lambda: jax.vmap(lambda q: fj.attention(q, q, q))(q[None]))
    table = jax.device_put(jnp.zeros((1, 1), jnp.int32), q.sharding)
    lengths = jax.device_put(jnp.full((1,), 64, jnp.int32), q.sharding)
    refuses_cpu(lambda: fj.paged_attention(q, q, q, table, table, lengths))
    refuses_cpu(lambda: fj.fp8_attention(q, q, q, fj.fp8_state()))
    mesh = jax.sharding.Mesh(jax.devices("cpu")[:1], ("cp",))
    spec = jax.sharding.PartitionSpec(None, "cp")
    ring = jax.shard_map(lambda q: fj.context_parallel_attention(q, q, q, axis_name="cp"), mesh=mesh,
                         in_specs=spec, out_specs=spec)
    refuses_cpu(lambda: ring(q))


def test_jax_calls_still_lower_for_cuda_here():
    jax, fj, _ = jax_on_cpu()
    q = jax.ShapeDtypeStruct((1, 64, 2, 64), jax.numpy.bfloat16)
    traced = jax.jit(lambda q: fj.attention(q, q, q)).trace(q)
    assert "fusedattn_forward" in traced.lower(lowering_platforms=("cuda",)).as_text()
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:  # a program for CUDA and the CPU at once
        traced.lower(lowering_platforms=("cuda", "cpu"))
    assert caught.value.value == "cpu"
