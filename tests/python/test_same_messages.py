"""One check, one wording: the same bad call gets the same message from the C++ core (a spec string
parsed and validated), the CLI, fusedattn.torch (meta tensors, no GPU) and fusedattn.jax (traced on
the CPU), since every adapter hands its call to the core's Config and make_spec (fusedattn/call.h);
context parallelism takes what `causal` does to a window from the core too (causal_window); a paged
call's tables and lengths and a dense call's lengths, which no spec holds, are checked in one place
for both (_config.py), and so are an FP8 cache's descales (_fp8_cache.py)."""
import os
import subprocess
from pathlib import Path

import pytest

from fusedattn import InvalidArgumentError, _core as core


def core_message(spec_text):
    with pytest.raises(InvalidArgumentError) as caught:
        core.Spec.parse(spec_text).validate()
    return str(caught.value)


def cli_message(spec_text):
    """What `fusedattn support "<spec>"` prints for it (after the kind of error)."""
    default = Path(os.environ.get("FUSEDATTN_PYTHON_BUILD", "build/python")).parent / "fusedattn"
    cli = Path(os.environ.get("FUSEDATTN_CLI", default))
    if not cli.is_file():
        pytest.skip(f"the fusedattn CLI is not built at {cli}")
    done = subprocess.run([str(cli), "support", spec_text], capture_output=True, text=True)
    assert done.returncode == 2, done
    return (done.stdout + done.stderr).strip().removeprefix("invalid_argument: ")


def adapter_message(framework, adapter, call):
    """The message of the InvalidArgumentError that `call(framework module, adapter module)` raises."""
    framework_module = pytest.importorskip(framework, reason=f"{framework} not installed")
    adapter_module = pytest.importorskip(adapter)
    with pytest.raises(InvalidArgumentError) as caught:
        call(framework_module, adapter_module)
    return str(caught.value)


def torch_message(call):
    return adapter_message("torch", "fusedattn.torch", call)


def jax_message(call):
    return adapter_message("jax", "fusedattn.jax", call)


def torch_meta(torch, *shape, dtype=None):
    return torch.empty(*shape, device="meta", dtype=dtype or torch.bfloat16)


def jax_traced(jax, fj, q_shape, k_shape, dtype="bfloat16", **options):
    """fusedattn.jax.attention traced under jit on abstract arrays (nothing runs)."""
    import jax.numpy as jnp
    q, k = jax.ShapeDtypeStruct(q_shape, jnp.dtype(dtype)), jax.ShapeDtypeStruct(k_shape, jnp.dtype(dtype))
    jax.jit(lambda q, k, v: fj.attention(q, k, v, **options)).lower(q, k, k)


# (name, spec string, q shape, k shape [b, s, h, d], options): calls the spec string describes.
CASES = [
    ("gqa", "layout=bshd b=1 s=16 h_q=6 h_kv=4 d=64", (1, 16, 6, 64), (1, 16, 4, 64), {}),
    ("head_dim", "layout=bshd b=1 s=16 h=4 d=12", (1, 16, 4, 12), (1, 16, 4, 12), {}),
    ("batch", "q=bf16[2,4,16,64]/[4096,64,256,1] k=bf16[3,4,16,64]/[4096,64,256,1] "
              "v=bf16[3,4,16,64]/[4096,64,256,1] o=bf16[2,4,16,64]/[4096,64,256,1]",
     (2, 16, 4, 64), (3, 16, 4, 64), {}),
    ("align", "layout=bshd b=1 s=16 h=4 d=64 align=diagonal", (1, 16, 4, 64), (1, 16, 4, 64), {"align": "diagonal"}),
    ("softmax", "layout=bshd b=1 s=16 h=4 d=64 softmax=sparse", (1, 16, 4, 64), (1, 16, 4, 64),
     {"softmax": "sparse"}),
    # causal closes the window's right side; beside a window that looks ahead it is a conflict.
    ("causal_window", "layout=bshd b=1 s=16 h=4 d=64 causal window=100,5", (1, 16, 4, 64), (1, 16, 4, 64),
     {"causal": True, "window": (100, 5)}),
]


@pytest.mark.parametrize("name, spec_text, q_shape, k_shape, options", CASES, ids=[c[0] for c in CASES])
def test_core_cli_torch_and_jax_say_the_same(name, spec_text, q_shape, k_shape, options):
    expected = core_message(spec_text)
    assert cli_message(spec_text) == expected
    assert torch_message(lambda torch, fa: fa.attention(torch_meta(torch, *q_shape), torch_meta(torch, *k_shape),
                                                        torch_meta(torch, *k_shape), **options)) == expected
    assert jax_message(lambda jax, fj: jax_traced(jax, fj, q_shape, k_shape, **options)) == expected


def test_adapters_say_the_same_of_what_no_spec_string_holds():
    """A bias of a shape that is none of the five kinds, and an element type the core does not take."""
    bias_shape = (2, 4, 16, 15)
    from_torch = torch_message(lambda torch, fa: fa.attention(*(torch_meta(torch, 2, 16, 4, 64),) * 3,
                                                             bias=torch_meta(torch, *bias_shape)))
    assert from_torch.startswith("bias.shape = [2,4,16,15]: ")

    def jax_bias(jax, fj):
        import jax.numpy as jnp
        x = jax.ShapeDtypeStruct((2, 16, 4, 64), jnp.bfloat16)
        bias = jax.ShapeDtypeStruct(bias_shape, jnp.bfloat16)
        jax.jit(lambda q, k, v, b: fj.attention(q, k, v, bias=b)).lower(x, x, x, bias)
    assert jax_message(jax_bias) == from_torch
    from_torch = torch_message(lambda torch, fa: fa.attention(
        *(torch_meta(torch, 1, 16, 4, 64, dtype=torch.float32),) * 3))
    assert from_torch.startswith("q.dtype = float32: ")
    assert jax_message(lambda jax, fj: jax_traced(jax, fj, (1, 16, 4, 64), (1, 16, 4, 64), dtype="float32")) == \
        from_torch


# A paged decode (4 sequences, 16 pages of 64 tokens each) with one array of another shape.
PAGED_CASES = [("page_table_k", (5, 16)), ("page_table_v", (4, 15)), ("seq_len_kv", (4, 1)), ("page_table_k", (64,))]


@pytest.mark.parametrize("name, shape", PAGED_CASES, ids=[f"{n}-{len(s)}d" for n, s in PAGED_CASES])
def test_adapters_say_the_same_of_a_paged_calls_tables_and_lengths(name, shape):
    """What the core reads by address and cannot see: both adapters check it in _config's words."""
    arrays = {"page_table_k": (4, 16), "page_table_v": (4, 16), "seq_len_kv": (4,), name: shape}

    def torch_paged(torch, fa):
        tables = {n: torch.empty(*s, device="meta", dtype=torch.int32) for n, s in arrays.items()}
        fa.paged_attention(torch_meta(torch, 4, 1, 32, 128), torch_meta(torch, 80, 64, 8, 128),
                           torch_meta(torch, 80, 64, 8, 128), tables["page_table_k"], tables["page_table_v"],
                           tables["seq_len_kv"])
    from_torch = torch_message(torch_paged)
    assert from_torch.startswith(f"{name}.shape = [{','.join(map(str, shape))}]: ")

    def jax_paged(jax, fj):
        import jax.numpy as jnp
        q = jax.ShapeDtypeStruct((4, 1, 32, 128), jnp.bfloat16)
        pool = jax.ShapeDtypeStruct((80, 64, 8, 128), jnp.bfloat16)
        tables = [jax.ShapeDtypeStruct(s, jnp.int32) for s in arrays.values()]
        jax.jit(lambda q, p, a, b, n: fj.paged_attention(q, p, p, a, b, n)).lower(q, pool, *tables)
    assert jax_message(jax_paged) == from_torch


# A dense call with runtime lengths (2 sequences), one of them of another shape.
LENGTH_CASES = [("seq_len_q", (3,)), ("seq_len_kv", (2, 1))]


@pytest.mark.parametrize("name, shape", LENGTH_CASES, ids=[n for n, _ in LENGTH_CASES])
def test_adapters_say_the_same_of_a_dense_calls_lengths(name, shape):
    """The lengths the core reads by address: both adapters check them in _config's words."""
    arrays = {"seq_len_q": (2,), "seq_len_kv": (2,), name: shape}

    def torch_padded(torch, fa):
        lengths = {n: torch.empty(*s, device="meta", dtype=torch.int32) for n, s in arrays.items()}
        fa.attention(*(torch_meta(torch, 2, 16, 4, 64),) * 3, **lengths)
    from_torch = torch_message(torch_padded)
    assert from_torch.startswith(f"{name}.shape = [{','.join(map(str, shape))}]: ")

    def jax_padded(jax, fj):
        import jax.numpy as jnp
        x = jax.ShapeDtypeStruct((2, 16, 4, 64), jnp.bfloat16)
        lengths = [jax.ShapeDtypeStruct(s, jnp.int32) for s in arrays.values()]
        jax.jit(lambda q, a, b: fj.attention(q, q, q, seq_len_q=a, seq_len_kv=b)).lower(x, *lengths)
    assert jax_message(jax_padded) == from_torch


def test_a_dense_calls_lengths_are_int32_in_pytorch():
    """PyTorch's lengths are read as they are: int64 ones (torch.tensor's default) would be read as
    pairs of int32. JAX's are converted to int32 (jnp.asarray), as its tables are."""
    message = torch_message(lambda torch, fa: fa.attention(
        *(torch_meta(torch, 2, 16, 4, 64),) * 3, seq_len_q=torch.empty(2, device="meta", dtype=torch.int32),
        seq_len_kv=torch.empty(2, device="meta", dtype=torch.int64)))
    assert message == "seq_len_kv.dtype = int64: int32"


# A paged decode over an FP8 cache gone wrong: (pool dtype, descale_k and descale_v as (shape, dtype)
# or None, the message's start). 8 K/V heads.
FP8_CACHE_CASES = [
    ("missing", "float8_e4m3fn", None, None, "descale_k = None: "),
    ("16-bit-cache", "bfloat16", ((1,), "float32"), ((1,), "float32"), "descale_k = given: "),
    ("per-head-length", "float8_e4m3fn", ((9,), "float32"), ((9,), "float32"), "descale_k.shape = [9]: [8], "),
    ("mixed", "float8_e4m3fn", ((8,), "float32"), ((1,), "float32"), "descale_v.shape = [1]: [8], "),
    ("dtype", "float8_e4m3fn", ((1,), "float16"), ((1,), "float32"), "descale_k.dtype = float16: float32"),
    ("e5m2", "float8_e5m2", ((1,), "float32"), ((1,), "float32"), "k.dtype = e5m2: "),
]


@pytest.mark.parametrize("pool_dtype, descale_k, descale_v, start", [c[1:] for c in FP8_CACHE_CASES],
                         ids=[c[0] for c in FP8_CACHE_CASES])
def test_adapters_say_the_same_of_an_fp8_caches_descales(pool_dtype, descale_k, descale_v, start):
    """Which descales an FP8 cache takes is checked in one place for both (_fp8_cache.py), its dtype
    by the core."""
    def torch_paged(torch, fa):
        table, lengths = torch.empty(4, 16, device="meta", dtype=torch.int32), torch.empty(4, device="meta",
                                                                                             dtype=torch.int32)
        pool = torch_meta(torch, 80, 64, 8, 128, dtype=getattr(torch, pool_dtype))
        descales = [None if d is None else torch_meta(torch, *d[0], dtype=getattr(torch, d[1]))
                    for d in (descale_k, descale_v)]
        fa.paged_attention(torch_meta(torch, 4, 1, 32, 128), pool, pool, table, table, lengths,
                           descale_k=descales[0], descale_v=descales[1])
    from_torch = torch_message(torch_paged)
    assert from_torch.startswith(start)

    def jax_paged(jax, fj):
        import jax.numpy as jnp
        arrays = [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)) for shape, dtype in (
            ((4, 1, 32, 128), "bfloat16"), ((80, 64, 8, 128), pool_dtype), ((4, 16), "int32"), ((4,), "int32"))]
        descales = [jax.ShapeDtypeStruct(d[0], jnp.dtype(d[1])) for d in (descale_k, descale_v) if d is not None]

        def call(q, p, t, n, *d):
            d = d or (None, None)
            return fj.paged_attention(q, p, p, t, t, n, descale_k=d[0], descale_v=d[1])
        jax.jit(call).lower(*arrays, *descales)
    assert jax_message(jax_paged) == from_torch


CAUSAL_CONFLICT = "window = 100,5: a right bound of 0 or -1 with causal (causal closes the window's right side)"


def test_context_parallelism_says_what_every_adapter_says_of_causal_beside_a_window_that_looks_ahead():
    """The words are the core's (causal_window) in the spec string and in both context-parallel calls,
    which refuse the call before they look at a process group or a mesh axis."""
    assert core_message("layout=bshd b=1 s=16 h=4 d=64 causal window=100,5") == CAUSAL_CONFLICT
    assert torch_message(lambda torch, fa: fa.context_parallel_attention(
        *(torch_meta(torch, 1, 16, 4, 64),) * 3, causal=True, window=(100, 5))) == CAUSAL_CONFLICT

    def jax_context_parallel(jax, fj):
        x = jax.numpy.zeros((1, 16, 4, 64), jax.numpy.bfloat16)
        fj.context_parallel_attention(x, x, x, axis_name="cp", causal=True, window=(100, 5))
    assert jax_message(jax_context_parallel) == CAUSAL_CONFLICT


def test_the_plan_path_validates_a_spec_that_no_one_validated_in_the_same_words():
    """Config.spec validates once and hands back a ValidatedSpec, which get_plan and check_support
    take as it is; a Spec that was only parsed is validated by them, before any device is asked."""
    spec_text = "layout=bshd b=1 s=16 h_q=6 h_kv=4 d=64"
    parsed = core.Spec.parse(spec_text)
    for entry in (core.get_plan, core.check_support):
        with pytest.raises(InvalidArgumentError) as caught:
            entry(parsed, core.Pass.forward)
        assert str(caught.value) == core_message(spec_text)
    view = ("bf16", (1, 16, 4, 64), (4096, 256, 64, 1))
    made = core.Config("bshd", causal=True).spec(view, view, view)
    assert isinstance(made, core.ValidatedSpec) and isinstance(made, core.Spec)
    assert made == core.Spec.parse("layout=bshd b=1 s=16 h=4 d=64 causal")
