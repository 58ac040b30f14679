"""fusedattn.jax.context_parallel_attention on one GPU: a mesh axis of one device, so inside
shard_map every block is this device's own, run through the core's FFI calls (cuDNN): the pieces
of a load-balanced causal block (the diagonal halves, the full one, the hidden one), windows with
their band modifiers, two-sided windows, packed sequences through ragged calls (windowed too). Against float32
attention of the whole problem, outputs and gradients, ring and all-gather against one reference (both
schemes of a case share it and its compiled program). The programs are the ones the CPU tests compile
on host devices, here compiled for a GPU."""
import functools

import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
if not any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("no GPU visible to JAX", allow_module_level=True)
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, PartitionSpec as P  # noqa: E402


def rel(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def whole(q, k, v, causal, window, scale):
    """float32 attention of bshd q, k, v, the core's window rule: key j visible to query i where
    i - L < j <= i + R (causal: R = 0)."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    ke, ve = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, ke, precision="highest") * scale
    left, right = window if window is not None else (-1, 0 if causal else -1)
    i, j = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
    keep = ((j > i - left) if left >= 0 else True) & ((j <= i + right) if right >= 0 else True)
    s = jnp.where(keep, s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), ve, precision="highest")


def one_device_mesh():
    return jax.make_mesh((1,), ("cp",), axis_types=(AxisType.Auto,),
                         devices=[d for d in jax.devices() if d.platform == "gpu"][:1])


def check_schemes(split, reference, inputs, w):
    """Output and gradients of split(*inputs, scheme) for both schemes against the jitted reference's,
    computed once: relative error under 1e-2 each."""
    loss = lambda f: (lambda *x: (f(*x).astype(jnp.float32) * w).sum())
    want = jax.jit(reference)(*inputs)
    want_grads = jax.jit(jax.grad(loss(reference), (0, 1, 2)))(*inputs)
    for scheme in ("ring", "all_gather"):
        ours = functools.partial(split, scheme=scheme)
        assert rel(jax.jit(ours)(*inputs), want) < 1e-2, scheme
        grads = jax.jit(jax.grad(loss(ours), (0, 1, 2)))(*inputs)
        for name, got, expected in zip("qkv", grads, want_grads):
            assert rel(got, expected) < 1e-2, f"{scheme}: d{name}"


@pytest.mark.parametrize("causal, balanced, window", [
    (True, True, None), (True, False, None), (False, False, None), (True, True, (300, 0)), (False, False, (300, 200))],
    ids=["causal_balanced", "causal_contiguous", "full", "window300_balanced", "window300_200"])
def test_one_device_equals_the_whole_sequence(causal, balanced, window):
    b, s, h_q, h_kv, d = 2, 1024, 8, 2, 128
    keys = jax.random.split(jax.random.key(7), 4)
    q = jax.random.uniform(keys[0], (b, s, h_q, d), minval=-1, maxval=1).astype(jnp.bfloat16)
    k, v = (jax.random.uniform(key, (b, s, h_kv, d), minval=-1, maxval=1).astype(jnp.bfloat16) for key in keys[1:3])
    w = jax.random.uniform(keys[3], (b, s, h_q, d), minval=-1, maxval=1)
    scale = d ** -0.5

    def split(q, k, v, scheme):
        @functools.partial(jax.shard_map, mesh=one_device_mesh(), in_specs=(P(None, "cp"),) * 3,
                           out_specs=P(None, "cp"))
        def blocks(q, k, v):
            return fj.context_parallel_attention(q, k, v, axis_name="cp", causal=causal, scheme=scheme,
                                                 load_balanced=balanced, scale=scale,
                                                 window=window if window is not None else (-1, -1))
        return blocks(q, k, v)

    check_schemes(split, lambda q, k, v: whole(q, k, v, causal, window, scale), (q, k, v), w)


@pytest.mark.parametrize("causal, balanced, window", [(True, True, None), (False, False, None),
                                                      (True, True, (200, 0))],
                         ids=["causal_balanced", "full", "window200_balanced"])
def test_packed_sequences_on_one_device_equal_each_sequences_own_attention(causal, balanced, window):
    # Sequences of 512, 0, 130 and 1002 tokens (multiples of 2), each piece one ragged call; under
    # the window (chunks of 256, 0, 65 and 501) the second chunk against the first runs as the
    # modifier of each sequence's bounds: covered in the short sequence, a band in the others.
    lengths, h_q, h_kv, d = [512, 0, 130, 1002], 8, 2, 128
    t = sum(lengths)
    cu = jnp.asarray([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], jnp.int32)
    keys = jax.random.split(jax.random.key(8), 4)
    q = jax.random.uniform(keys[0], (t, h_q, d), minval=-1, maxval=1).astype(jnp.bfloat16)
    k, v = (jax.random.uniform(key, (t, h_kv, d), minval=-1, maxval=1).astype(jnp.bfloat16) for key in keys[1:3])
    w = jax.random.uniform(keys[3], (t, h_q, d), minval=-1, maxval=1)
    scale = d ** -0.5

    def split(q, k, v, scheme):
        @functools.partial(jax.shard_map, mesh=one_device_mesh(), in_specs=(P("cp"),) * 3 + (P(),),
                           out_specs=P("cp"))
        def blocks(q, k, v, cu):
            return fj.context_parallel_attention(q, k, v, axis_name="cp", causal=causal, scheme=scheme,
                                                 load_balanced=balanced, scale=scale, cu_seqlens=cu,
                                                 max_seqlen=max(lengths), window=window or (-1, -1))
        return blocks(q, k, v, cu)

    def reference(q, k, v):
        outs, start = [], 0
        for length in lengths:
            piece = [x[start:start + length][None] for x in (q, k, v)]
            outs.append(whole(*piece, causal, window, scale)[0])
            start += length
        return jnp.concatenate(outs)

    check_schemes(split, reference, (q, k, v), w)
