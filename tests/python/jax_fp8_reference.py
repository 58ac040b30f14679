"""The JAX FP8 tests' reference: a plain-JAX FP8 kernel to stand in for cuDNN's in
fusedattn.jax._kernels.KERNELS (dequantize the FP8 inputs with their descales, float32 attention,
the amaxes, O and the gradients quantized with their scales, as cuDNN's FP8 kernels take and return
them), float32 attention of the unquantized inputs, the inputs, and jitted training steps."""
import functools

import jax
import jax.numpy as jnp
import numpy as np  # JAX brings it
import pytest

import fusedattn.jax as fj
from fusedattn.jax._calls import BACKWARD, FORWARD
from fusedattn.jax._fp8_state import TENSORS
from fusedattn.jax._kernels import KERNELS

SLOT = {name: i for i, name in enumerate(TENSORS)}
E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def attend(q, k, v, scale, causal, lengths=()):
    """float32 attention of [b, s, h, d] arrays (GQA by repeating K/V heads); O and the statistics.
    lengths: (seq_len_q, seq_len_kv) [b], keys past seq_len_kv masked and rows past seq_len_q zero in O
    (so they give no gradient), as fusedattn's padding defines them; () for none."""
    group = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, group, axis=2) for x in (k, v))
    logits = jnp.einsum("bshd,bthd->bhst", q, k) * scale
    if causal:
        logits = jnp.where(jnp.tril(jnp.ones(logits.shape[-2:], bool)), logits, -jnp.inf)
    if lengths:
        keys = jnp.arange(k.shape[1])[None, :] < lengths[1][:, None]  # [b, t]
        logits = jnp.where(keys[:, None, None, :], logits, -jnp.inf)
    stats = jax.nn.logsumexp(logits, axis=-1)
    p = jnp.exp(logits - stats[..., None])
    o = jnp.einsum("bhst,bthd->bshd", p, v)
    if lengths:
        o = jnp.where((jnp.arange(q.shape[1])[None, :] < lengths[0][:, None])[:, :, None, None], o, 0.0)
    return o, stats, p


def _lengths(a):
    """The call's runtime lengths among its arrays by role (Call.inputs), or ()."""
    return (a["seq_len_q"], a["seq_len_kv"]) if "seq_len_kv" in a else ()


def quantized(x, scale, dtype):
    # The barrier keeps the FP8 values opaque, as the FFI call's are: without it XLA's GPU compiler
    # (allowing excess precision) drops the float32 -> FP8 -> float32 round trip, and the rounding
    # this module tests never happens.
    fp8_max = float(jnp.finfo(dtype).max)
    return jax.lax.optimization_barrier(jnp.clip(x * scale, -fp8_max, fp8_max).astype(dtype))


def fp8_forward(call, *arrays):
    """The FP8 forward as the FFI call takes and returns it (Call.inputs / Call.outputs)."""
    assert call.fp8 and len(arrays) == len(call.inputs(FORWARD))
    a = dict(zip(call.inputs(FORWARD), arrays))
    q, k, v = (a[n].astype(jnp.float32) * a["descale_" + n] for n in "qkv")
    o, stats, p = attend(q, k, v, call.scale, call.config.window == (-1, 0), _lengths(a))
    return quantized(o, a["scale_o"], a["q"].dtype), stats, p.max(), jnp.abs(o).max()


def fp8_backward(call, *arrays):
    a = dict(zip(call.inputs(BACKWARD), arrays))
    assert len(arrays) == len(call.inputs(BACKWARD))
    if not call.fp8:  # backward="model": float32 math on the unquantized inputs, in their dtype
        q, k, v, d_o = (a[n].astype(jnp.float32) for n in ("q", "k", "v", "d_o"))
        _, pullback = jax.vjp(lambda q, k, v: attend(q, k, v, call.scale, call.config.window == (-1, 0),
                                                     _lengths(a))[0], q, k, v)
        return tuple(g.astype(a["q"].dtype) for g in pullback(d_o))
    q, k, v, d_o = (a[n].astype(jnp.float32) * a["descale_" + n] for n in ("q", "k", "v", "d_o"))
    causal = call.config.window == (-1, 0)
    _, pullback = jax.vjp(lambda q, k, v: attend(q, k, v, call.scale, causal, _lengths(a))[0], q, k, v)
    grads = pullback(d_o)
    group = q.shape[2] // k.shape[2]
    d_p = jnp.einsum("bshd,bthd->bhst", d_o, jnp.repeat(v, group, axis=2))
    fp8 = a["d_o"].dtype  # the gradients' format: dO's (E5M2 beside E4M3 inputs, the hybrid recipe)
    out = [quantized(g, a["scale_" + n], fp8) for g, n in zip(grads, ("d_q", "d_k", "d_v"))]
    return (*out, *(jnp.abs(g).max() for g in grads), jnp.abs(d_p).max())


# A fixture the test files import: pytest finds it in their namespace.
@pytest.fixture
def reference_kernels(monkeypatch):
    monkeypatch.setitem(KERNELS, FORWARD, fp8_forward)
    monkeypatch.setitem(KERNELS, BACKWARD, fp8_backward)


def inputs(seed, shape=(2, 64, 4, 64), kv_heads=4, amax=(1.0, 1.0, 1.0)):
    keys = jax.random.split(jax.random.key(seed), 4)
    kv_shape = shape[:2] + (kv_heads,) + shape[3:]
    q, k, v = (jax.random.normal(key, s) * a for key, s, a in zip(keys, (shape, kv_shape, kv_shape), amax))
    w = jax.random.normal(keys[3], shape)  # the loss's weights: dO
    return q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), w


def rel_l2(x, y):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


# Where the default device is the host: its programs run a few times on small arrays, and LLVM's
# optimization of them was most of their compile time, which was most of this file's. (Nothing on a
# GPU changes.)
HOST_FAST_COMPILE = ({"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
                     if jax.default_backend() == "cpu" else None)


def make_training_step(causal, backward="fp8"):
    """A jitted training step: (loss, O, the gradients of q, k, v, the next state)."""
    def loss_fn(q, k, v, state, w):
        o, _ = fj.fp8_attention(q, k, v, state, causal=causal, backward=backward)
        return (o.astype(jnp.float32) * w).sum(), o

    @functools.partial(jax.jit, compiler_options=HOST_FAST_COMPILE)
    def step(q, k, v, state, w):
        (loss, o), grads = jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, state, w)
        return loss, o, grads[:3], grads[3]  # the state's gradient is the next state
    return step


# One jitted step per (causal, backward), shared by the tests: those whose inputs have the same
# shapes and whose states the same structure reuse its compiled programs. (A test that changes what
# tracing does makes its own, make_training_step.)
training_step = functools.cache(make_training_step)


def reference(q, k, v, w, causal, lengths=()):
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1])
    o, pullback = jax.vjp(lambda q, k, v: attend(q, k, v, scale, causal, lengths)[0], q, k, v)
    return o, pullback(w)


def fp8_inputs(seed, dtype=jnp.float8_e4m3fn):
    """Q, K, V in FP8 by current scaling, as an FP8 projection hands them on, their descales, and the
    values they hold."""
    q, k, v, _ = inputs(seed, kv_heads=2, amax=(1.0, 2.0, 3.0))
    fp8_max = float(jnp.finfo(dtype).max)
    out = []
    for x in (q, k, v):
        scale = fp8_max / jnp.max(jnp.abs(x.astype(jnp.float32)))
        x8 = (x.astype(jnp.float32) * scale).astype(dtype)
        out.append((x8, 1.0 / scale, x8.astype(jnp.float32) / scale))
    return [t[0] for t in out], tuple(t[1] for t in out), [t[2] for t in out]
