"""fusedattn.jax under a mesh, without a GPU: 8 host devices, q, k, v sharded over batch ("data")
and heads ("model"). The partitioning is fusedattn's own; the per-device kernel is replaced by a
plain-JAX reference (the FFI targets exist only for CUDA), so this checks the partitioning logic:
the sharded program gathers nothing, keeps the shardings, and equals the unsharded one. The arrays
are bfloat16, as the core takes them (it validates each call while tracing); the reference computes
in float32, so outputs agree to float32 rounding and bfloat16 gradients to one bfloat16 rounding."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax", reason="JAX not installed")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")

CHILD = r"""
import sys
import jax, jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import fusedattn.jax as fj
from fusedattn import _config
from fusedattn.jax._calls import BACKWARD, FORWARD, Call
from fusedattn.jax._kernels import KERNELS

LAYOUT, H_KV, EXTRA, AXES = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
WITH_BIAS = EXTRA == "bias"
SHARDED = []  # (pass, q shape) each reference kernel was called with


def to_bshd(x):
    return x if LAYOUT == "bshd" else jnp.swapaxes(x, 0, 1)


def from_bshd(x):
    return to_bshd(x)


def ref_forward(q, k, v, call, bias=None):
    q, k, v = (to_bshd(x).astype(jnp.float32) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, group, axis=2) for x in (k, v))
    logits = jnp.einsum("bshd,bthd->bhst", q, k) * call.scale
    if bias is not None:
        logits = logits + bias
    if call.config.window == (-1, 0):
        logits = jnp.where(jnp.tril(jnp.ones(logits.shape[-2:], bool)), logits, -jnp.inf)
    stats = jax.nn.logsumexp(logits, axis=-1)
    o = jnp.einsum("bhst,bthd->bshd", jnp.exp(logits - stats[..., None]), v)
    return from_bshd(o), stats, logits.max(axis=-1)


def forward(call, *arrays):  # in the roles and with the results the call's config gives
    a = dict(zip(call.inputs(FORWARD), arrays))
    SHARDED.append(("forward" if call.config.stats else "inference", a["q"].shape))
    o, stats, row_max = ref_forward(a["q"], a["k"], a["v"], call, a.get("bias"))
    if call.config.dropout > 0:  # no mask here: the output shows the offset each shard was given
        o = o + a["rng"][2].astype(o.dtype)
    # A max logit: [b, h, s] per row, [h] per head (over this shard's batch).
    max_logit = {"none": (), "row": (row_max,), "head": (row_max.max(axis=(0, 2)),)}[call.config.max_logit]
    out = (o,) + ((stats,) if call.config.stats else ()) + max_logit
    assert len(out) == len(call.outputs(FORWARD))
    return out if len(out) > 1 else o


def backward(call, *arrays):
    a = dict(zip(call.inputs(BACKWARD), arrays))
    SHARDED.append(("backward", a["q"].shape))
    if "bias" not in a:
        _, pullback = jax.vjp(lambda q, k, v: ref_forward(q, k, v, call)[0], a["q"], a["k"], a["v"])
        return pullback(a["d_o"])
    _, pullback = jax.vjp(lambda q, k, v, bias: ref_forward(q, k, v, call, bias)[0], a["q"], a["k"], a["v"],
                          a["bias"])
    return pullback(a["d_o"])  # with the bias's gradient


KERNELS.update({FORWARD: forward, BACKWARD: backward})
mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto if AXES == "auto" else AxisType.Explicit,) * 2)
b, s, h_q, h_kv, d = 4, 32, 8, H_KV, 16
shape = {"bshd": lambda h: (b, s, h, d), "sbhd": lambda h: (s, b, h, d)}[LAYOUT]
spec = P("data", None, "model", None) if LAYOUT == "bshd" else P(None, "data", "model", None)
keys = jax.random.split(jax.random.key(0), 5)
q, k, v = (jax.random.normal(key, shape(h)).astype(jnp.bfloat16) for key, h in zip(keys, (h_q, h_kv, h_kv)))
d_o = jax.random.normal(keys[3], shape(h_q))
kv_spec = spec if H_KV % 4 == 0 else P(*(None if axis == "model" else axis for axis in spec))  # whole heads
sharded = [jax.device_put(x, NamedSharding(mesh, sp)) for x, sp in zip((q, k, v, d_o), (spec, kv_spec, kv_spec, spec))]

bias = jax.random.normal(keys[4], (b, h_q, s, s)).astype(jnp.bfloat16) if WITH_BIAS else None  # bhss: split like q
sharded_bias = jax.device_put(bias, NamedSharding(mesh, P("data", "model", None, None))) if WITH_BIAS else None


def attend(q, k, v, bias=None):
    return fj.attention(q, k, v, layout=LAYOUT, causal=True, bias=bias)


def loss(q, k, v, d_o, bias=None):
    return (attend(q, k, v, bias) * d_o).sum()


forward_fn = jax.jit(attend)
grad_fn = jax.jit(jax.grad(loss, (0, 1, 2, 4) if WITH_BIAS else (0, 1, 2)))
out = forward_fn(*sharded[:3], sharded_bias)
grads = grad_fn(*sharded, sharded_bias)
texts = [forward_fn.lower(*sharded[:3], sharded_bias).compile().as_text(),
         grad_fn.lower(*sharded, sharded_bias).compile().as_text()]
call = Call(_config.config(LAYOUT, causal=True), 1 / d ** 0.5)
ref_out = ref_forward(q, k, v, call, bias)[0]
ref_grads = jax.grad(lambda q, k, v, bias: (ref_forward(q, k, v, call, bias)[0] * d_o).sum(),
                     (0, 1, 2, 3) if WITH_BIAS else (0, 1, 2))(q, k, v, bias)
print("OUT_ERR", float(jnp.abs(out - ref_out).max()))
print("GRAD_ERR", max(float(jnp.abs(g.astype(jnp.float32) - r).max() / jnp.abs(r.astype(jnp.float32)).max())
                      for g, r in zip(grads, ref_grads)))  # relative to the largest: a bfloat16 rounding apart
print("OUT_SPEC", out.sharding.spec == spec, [g.sharding.spec == spec for g in grads[:3]])
print("GATHERS", sum(t.count("all-gather") + t.count("all-to-all") + t.count("collective-permute") for t in texts))
print("SHARD_SHAPES", sorted(set(SHARDED)))
if EXTRA == "maxlogit":  # a head's max logit is a max over the whole batch, across the data shards
    _, heads_max = jax.jit(lambda q, k, v: fj.attention(q, k, v, layout=LAYOUT, causal=True,
                                                          return_max_logit="head"))(*sharded[:3])
    expected = ref_forward(q, k, v, call)[2].max(axis=(0, 2))
    print("MAXLOGIT_ERR", float(jnp.abs(heads_max - expected).max()))
if EXTRA == "dropout":  # the offset each device's shard was given, read back from the output
    dropped = jax.jit(lambda q, k, v: fj.attention(q, k, v, layout=LAYOUT, causal=True, dropout_rate=0.1,
                                                   dropout_key=jax.random.key(1)))(*sharded[:3])
    offsets = np.rint(np.asarray(dropped - out)).astype(int)
    per_shard = sorted({int(offsets[i * 2, 0, j * 2, 0]) for i in range(2) for j in range(4)})
    print("OFFSETS", per_shard)
"""


def run_child(layout, h_kv, extra="none", axes="explicit"):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", CHILD, layout, str(h_kv), extra, axes], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert float(lines["OUT_ERR"]) < 1e-5 and float(lines["GRAD_ERR"]) < 1e-2, done.stdout
    return lines, done.stdout


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_data_and_head_sharding_partitions_without_gathering(layout):
    lines, out = run_child(layout, h_kv=4)  # GQA: 8 query heads over 4 K/V heads, 4 devices on "model"
    assert lines["OUT_SPEC"] == "True [True, True, True]", out
    assert lines["GATHERS"] == "0", out
    # Each device saw its shard: batch 4 / 2 data, heads 8 / 4 model (as well as the global trace).
    local_q = "(2, 32, 2, 16)" if layout == "bshd" else "(32, 2, 2, 16)"
    for kind in ("forward", "backward"):
        assert f"('{kind}', {local_q})" in lines["SHARD_SHAPES"], out


def test_heads_the_kv_heads_cannot_follow_are_gathered_and_still_right():
    # MQA: one K/V head cannot be split 4 ways. On an Auto mesh: on an Explicit one, JAX 0.11 type-
    # checks the stand-in kernel's einsum at global shapes (q's heads split, k's whole) and refuses
    # it before any partitioning; the CUDA kernel is one FFI call with no such check.
    lines, out = run_child("bshd", h_kv=1, axes="auto")
    assert "('forward', (2, 32, 8, 16))" in lines["SHARD_SHAPES"], out  # batch split, heads whole


def test_a_bias_is_split_with_the_batch_and_heads_it_has():
    lines, out = run_child("bshd", h_kv=4, extra="bias")
    assert lines["GATHERS"] == "0", out
    assert "('backward', (2, 32, 2, 16))" in lines["SHARD_SHAPES"], out


def test_dropout_gives_every_shard_its_own_offset():
    lines, out = run_child("bshd", h_kv=4, extra="dropout")
    assert lines["OFFSETS"] == str(list(range(8))), out  # 2 data x 4 model shards, offsets 0..7


def test_a_heads_max_logit_is_the_max_over_all_batch_shards():
    lines, out = run_child("bshd", h_kv=4, extra="maxlogit")
    assert float(lines["MAXLOGIT_ERR"]) < 1e-5, out
