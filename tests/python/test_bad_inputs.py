"""Bad input at the adapters' entry points: each refused with the field, the value seen and the
requirement, before any work (issue 20). PyTorch on the meta device and CPU tensors, JAX while
tracing under jit; the core's own checks of a call's pointers are tests/cpu/test_tensor_set.cpp."""
import pytest

import fusedattn

torch = pytest.importorskip("torch", reason="PyTorch not installed")


def meta(*shape, dtype=torch.bfloat16, device="meta"):
    return torch.empty(*shape, dtype=dtype, device=device)


Q = (2, 64, 4, 64)

# (name, call, field, part of the value, part of the requirement)
TORCH_CASES = [
    ("float32", lambda fa: fa.attention(*(meta(*Q, dtype=torch.float32),) * 3), "q.dtype", "float32", "bf16"),
    ("int32", lambda fa: fa.attention(meta(*Q, dtype=torch.int32), meta(*Q), meta(*Q)), "q.dtype", "int32", "f16"),
    ("mixed dtypes", lambda fa: fa.attention(meta(*Q), meta(*Q, dtype=torch.float16), meta(*Q)), "k.dtype", "f16",
     "the dtype of q"),
    ("rank 3", lambda fa: fa.attention(meta(2, 64, 256), meta(*Q), meta(*Q)), "q.shape", "[2,64,256]", "4 dims"),
    ("head dims", lambda fa: fa.attention(meta(*Q), meta(2, 64, 4, 32), meta(2, 64, 4, 32)), "d_qk", "32",
     "equal to q's"),
    ("batch", lambda fa: fa.attention(meta(*Q), meta(3, 64, 4, 64), meta(3, 64, 4, 64)), "b", "3", "equal to q's"),
    ("heads", lambda fa: fa.attention(meta(2, 64, 6, 64), meta(*Q), meta(*Q)), "h_q", "6", "a multiple of h_kv"),
    ("strides", lambda fa: fa.attention(meta(2, 64, 64, 4).transpose(-1, -2), meta(*Q), meta(*Q)), "q.strides",
     "[16384,1,256,4]", "stride of 1"),
    ("CPU tensors", lambda fa: fa.attention(*(meta(*Q, device="cpu"),) * 3), "q.device", "cpu", "a CUDA device"),
    ("mixed devices", lambda fa: fa.attention(meta(*Q), meta(*Q, device="cpu"), meta(*Q)), "k.device", "cpu",
     "q's device"),
    ("layout", lambda fa: fa.attention(*(meta(*Q),) * 3, layout="bsdh"), "layout", "bsdh", "bshd"),
    ("window", lambda fa: fa.attention(*(meta(*Q),) * 3, window=(-5, 0)), "window", "-5,0", "left bound"),
    ("dropout", lambda fa: fa.attention(*(meta(*Q),) * 3, dropout_p=1.5), "dropout", "1.5", "[0, 1)"),
    ("bias dtype", lambda fa: fa.attention(*(meta(*Q),) * 3, bias=meta(1, 4, 64, 64, dtype=torch.float32)),
     "bias.dtype", "float32", ""),
    ("bias shape", lambda fa: fa.attention(*(meta(*Q),) * 3, bias=meta(1, 4, 64, 65)), "bias.shape", "65", ""),
    ("ragged without offsets", lambda fa: fa.attention(*(meta(128, 4, 64),) * 3, layout="thd"), "cu_seqlens_q",
     "", ""),
]


@pytest.mark.parametrize("name, call, field, value, requirement", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_torch_refuses_with_field_value_and_requirement(name, call, field, value, requirement):
    import fusedattn.torch as fa
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        call(fa)
    error = caught.value
    assert error.field == field, str(error)
    assert value in error.value and requirement in error.requirement, str(error)


def _jax_cases():
    jnp = pytest.importorskip("jax.numpy", reason="JAX not installed")

    def arrays(*shapes, dtype=jnp.bfloat16):
        return [jnp.zeros(s, dtype) for s in shapes]
    return [
        ("float32", lambda fj: fj.attention(*arrays(Q, Q, Q, dtype=jnp.float32)), "q.dtype", "float32", "bf16"),
        ("mixed dtypes", lambda fj: fj.attention(*arrays(Q), *arrays(Q, dtype=jnp.float16), *arrays(Q)), "k.dtype",
         "f16", "the dtype of q"),
        ("rank 3", lambda fj: fj.attention(*arrays((2, 64, 256), Q, Q)), "q.shape", "[2,64,256]", "4 dims"),
        ("head dims", lambda fj: fj.attention(*arrays(Q, (2, 64, 4, 32), (2, 64, 4, 32))), "d_qk", "32", "equal"),
        ("heads", lambda fj: fj.attention(*arrays((2, 64, 6, 64), Q, Q)), "h_q", "6", "a multiple of h_kv"),
        ("window", lambda fj: fj.attention(*arrays(Q, Q, Q), window=(-5, 0)), "window", "-5,0", "left bound"),
        ("bias shape", lambda fj: fj.attention(*arrays(Q, Q, Q), bias=jnp.zeros((1, 4, 64, 65), jnp.bfloat16)),
         "bias.shape", "65", ""),
    ]


@pytest.mark.parametrize("case", range(7))
def test_jax_refuses_under_jit_with_field_value_and_requirement(case):
    jax = pytest.importorskip("jax", reason="JAX not installed")
    pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")
    import fusedattn.jax as fj
    name, call, field, value, requirement = _jax_cases()[case]
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        jax.jit(lambda: call(fj)).lower()  # refused while tracing: before anything runs
    error = caught.value
    assert error.field == field, f"{name}: {error}"
    assert value in error.value and requirement in error.requirement, f"{name}: {error}"
