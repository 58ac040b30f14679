"""fusedattn.jax under a mesh, without a GPU: 8 host devices, q, k, v sharded over batch ("data")
and heads ("model"). The partitioning is fusedattn's own; the per-device kernel is replaced by a
plain-JAX reference (the FFI targets exist only for CUDA), so this checks the partitioning logic:
the sharded program gathers nothing, keeps the shardings, and equals the unsharded one. The arrays
are bfloat16, as the core takes them (it validates each call while tracing); the reference computes
in float32, so outputs agree to float32 rounding and bfloat16 gradients to one bfloat16 rounding.
One child process checks every configuration; each test reads its own from it."""
import functools
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax", reason="JAX not installed")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")

CHILD = r"""
import json, sys
import jax, jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import fusedattn.jax as fj
from fusedattn import _config
from fusedattn.jax._calls import BACKWARD, FORWARD, Call
from fusedattn.jax._kernels import KERNELS

SHARDED = []  # (pass, q shape) each reference kernel was called with, for the configuration at hand


def ref_forward(q, k, v, call, bias=None):
    # The layout is the call's: sbhd swapped to bshd and back.
    to_bshd = (lambda x: x) if call.config.layout == "bshd" else (lambda x: jnp.swapaxes(x, 0, 1))
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
    return to_bshd(o), stats, logits.max(axis=-1)


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


def compiled(fn, *args):
    # One compile a program: its results and its text from the same executable.
    executable = jax.jit(fn).lower(*args).compile()
    return executable(*args), executable.as_text()


def check(label, layout, h_kv, extra, axes):
    SHARDED.clear()
    with_bias = extra == "bias"
    mesh = jax.make_mesh((2, 4), ("data", "model"),
                         axis_types=(AxisType.Auto if axes == "auto" else AxisType.Explicit,) * 2)
    b, s, h_q, d = 4, 32, 8, 16
    shape = {"bshd": lambda h: (b, s, h, d), "sbhd": lambda h: (s, b, h, d)}[layout]
    spec = P("data", None, "model", None) if layout == "bshd" else P(None, "data", "model", None)
    keys = jax.random.split(jax.random.key(0), 5)
    q, k, v = (jax.random.normal(key, shape(h)).astype(jnp.bfloat16) for key, h in zip(keys, (h_q, h_kv, h_kv)))
    d_o = jax.random.normal(keys[3], shape(h_q))
    kv_spec = spec if h_kv % 4 == 0 else P(*(None if axis == "model" else axis for axis in spec))  # whole heads
    sharded = [jax.device_put(x, NamedSharding(mesh, sp)) for x, sp in zip((q, k, v, d_o), (spec, kv_spec, kv_spec, spec))]

    bias = jax.random.normal(keys[4], (b, h_q, s, s)).astype(jnp.bfloat16) if with_bias else None  # bhss: split like q
    sharded_bias = jax.device_put(bias, NamedSharding(mesh, P("data", "model", None, None))) if with_bias else None

    def attend(q, k, v, bias=None):
        return fj.attention(q, k, v, layout=layout, causal=True, bias=bias)

    def loss(q, k, v, d_o, bias=None):
        return (attend(q, k, v, bias) * d_o).sum()

    out, forward_text = compiled(attend, *sharded[:3], sharded_bias)
    grads, grad_text = compiled(jax.grad(loss, (0, 1, 2, 4) if with_bias else (0, 1, 2)), *sharded, sharded_bias)
    call = Call(_config.config(layout, causal=True), 1 / d ** 0.5)
    ref_out = ref_forward(q, k, v, call, bias)[0]
    ref_grads = jax.grad(lambda q, k, v, bias: (ref_forward(q, k, v, call, bias)[0] * d_o).sum(),
                         (0, 1, 2, 3) if with_bias else (0, 1, 2))(q, k, v, bias)
    print(label, "OUT_ERR", float(jnp.abs(out - ref_out).max()))
    print(label, "GRAD_ERR", max(float(jnp.abs(g.astype(jnp.float32) - r).max() / jnp.abs(r.astype(jnp.float32)).max())
                                 for g, r in zip(grads, ref_grads)))  # relative to the largest: a bfloat16 rounding apart
    print(label, "OUT_SPEC", out.sharding.spec == spec, [g.sharding.spec == spec for g in grads[:3]])
    print(label, "GATHERS", sum(t.count("all-gather") + t.count("all-to-all") + t.count("collective-permute")
                                for t in (forward_text, grad_text)))
    print(label, "SHARD_SHAPES", sorted(set(SHARDED)))
    if extra == "maxlogit":  # a head's max logit is a max over the whole batch, across the data shards
        _, heads_max = jax.jit(lambda q, k, v: fj.attention(q, k, v, layout=layout, causal=True,
                                                              return_max_logit="head"))(*sharded[:3])
        expected = ref_forward(q, k, v, call)[2].max(axis=(0, 2))
        print(label, "MAXLOGIT_ERR", float(jnp.abs(heads_max - expected).max()))
    if extra == "dropout":  # the offset each device's shard was given, read back from the output
        dropped = jax.jit(lambda q, k, v: fj.attention(q, k, v, layout=layout, causal=True, dropout_rate=0.1,
                                                       dropout_key=jax.random.key(1)))(*sharded[:3])
        offsets = np.rint(np.asarray(dropped - out)).astype(int)
        per_shard = sorted({int(offsets[i * 2, 0, j * 2, 0]) for i in range(2) for j in range(4)})
        print(label, "OFFSETS", per_shard)


KERNELS.update({FORWARD: forward, BACKWARD: backward})
for label, (layout, h_kv, extra, axes) in json.loads(sys.argv[1]).items():
    check(label, layout, h_kv, extra, axes)
"""

# Every configuration the tests below read, checked by one child process (JAX's import and 8 host
# devices are seconds of a child): {label: (layout, h_kv, extra, mesh axes)}.
CONFIGS = {
    "bshd": ("bshd", 4, "none", "explicit"),
    "sbhd": ("sbhd", 4, "none", "explicit"),
    "mqa": ("bshd", 1, "none", "auto"),
    "bias": ("bshd", 4, "bias", "explicit"),
    "dropout": ("bshd", 4, "dropout", "explicit"),
    "maxlogit": ("bshd", 4, "maxlogit", "explicit"),
}
# The children's programs run once on a few thousand elements: LLVM's optimization of the host
# code would cost more than it saves, and changes nothing the tests look at.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


@functools.cache
def results():
    """The child's lines, {label: {NAME: value}}, and its stdout: made by the first test that asks."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8 " + FAST_COMPILE,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CONFIGS)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = {label: {} for label in CONFIGS}
    for line in done.stdout.splitlines():
        label, name, value = line.split(" ", 2)
        lines[label][name] = value
    return lines, done.stdout


def run_child(label):
    lines, out = results()
    lines = lines[label]
    assert float(lines["OUT_ERR"]) < 1e-5 and float(lines["GRAD_ERR"]) < 1e-2, out
    return lines, out


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_data_and_head_sharding_partitions_without_gathering(layout):
    lines, out = run_child(layout)  # GQA: 8 query heads over 4 K/V heads, 4 devices on "model"
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
    lines, out = run_child("mqa")
    assert "('forward', (2, 32, 8, 16))" in lines["SHARD_SHAPES"], out  # batch split, heads whole


def test_a_bias_is_split_with_the_batch_and_heads_it_has():
    lines, out = run_child("bias")
    assert lines["GATHERS"] == "0", out
    assert "('backward', (2, 32, 2, 16))" in lines["SHARD_SHAPES"], out


def test_dropout_gives_every_shard_its_own_offset():
    lines, out = run_child("dropout")
    assert lines["OFFSETS"] == str(list(range(8))), out  # 2 data x 4 model shards, offsets 0..7


def test_a_heads_max_logit_is_the_max_over_all_batch_shards():
    lines, out = run_child("maxlogit")
    assert float(lines["MAXLOGIT_ERR"]) < 1e-5, out
