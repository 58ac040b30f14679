"""fusedattn.jax.context_parallel_attention without a GPU: 4 host devices on a mesh axis, the
sequence split across them, ring and all-gather, against attention of the whole sequence (outputs
and gradients). The per-device kernels are plain-JAX stand-ins in fusedattn.jax._kernels.KERNELS
that take and return what the core's FFI calls do; the backward one uses the O and statistics it is
given, as cuDNN's does, so the test holds the merged statistics the algorithm hands each block.

Each test runs one child process (JAX's import and 4 host devices are seconds of it) that checks
all its configurations: one compiled program a configuration (the output comes with the gradients,
and the collectives are counted in that program's text), one jitted reference a set of inputs,
shared by ring and all-gather."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax", reason="JAX not installed")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")

# What both children share: for each configuration its program (output and gradients at once) and
# its reference's, in float32. A child gives `check` its `ours` and `whole` for the configuration;
# REFERENCES keeps one answer per set of inputs (`key`), since every scheme and layout must give it.
CHECK = r"""
import functools, json, sys
import jax, jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec as P
import fusedattn.jax as fj
from fusedattn import _config, _context_parallel as _cp
from fusedattn.jax._calls import BACKWARD, FORWARD
from fusedattn.jax._kernels import KERNELS

CONFIGS = json.loads(sys.argv[1])  # {label: its settings}
REFERENCES = {}
CALLS = []


def value_and_grads(f, w, with_sink):
    def loss(q, k, v, sink):
        out = f(q, k, v, sink)
        return (out.astype(jnp.float32) * w).sum(), out
    return jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3) if with_sink else (0, 1, 2), has_aux=True))


def check(label, ours, whole, key, with_sink, q, k, v, w, sink):
    # Prints the errors; returns the compiled program's text. Traced (CALLS filled) while lowering.
    CALLS.clear()
    step = value_and_grads(ours, w, with_sink).lower(q, k, v, sink).compile()
    (_, out), grads = step(q, k, v, sink)
    if key not in REFERENCES:
        REFERENCES[key] = value_and_grads(whole, w, with_sink)(q, k, v, sink)
    (_, ref), ref_grads = REFERENCES[key]
    rel = lambda a, b: float(jnp.linalg.norm(a.astype(jnp.float32) - b) / jnp.linalg.norm(b))
    print(label, "OUT_ERR", rel(out, ref))
    print(label, "GRAD_ERR", max(rel(g, r) for g, r in zip(grads, ref_grads)))
    return step.as_text()


def visible_window(i, j, left, right):  # the window (L, R) from the top-left: i - L < j <= i + R, -1 no bound
    return ((j > i - left) if left >= 0 else True) & ((j <= i + right) if right >= 0 else True)
"""

CHILD = CHECK + r"""
BANDS = {_config.config("bshd", score_mod=mod).score_mod: below  # as the core prints them
         for mod, below in ((_cp.BAND, False), (_cp.BAND_BELOW, True))}


def logits(call, q, k, mods):
    # The masks context parallelism sends: the window (L, R) from the top-left (causal: (-1, 0)),
    # or the band j - i >= offset (j - i <= offset) of the score modifier _cp.BAND (_cp.BAND_BELOW),
    # its offset the one scalar operand.
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") * call.scale
    i, j = jnp.arange(s.shape[-2])[:, None], jnp.arange(s.shape[-1])[None, :]
    s = jnp.where(visible_window(i, j, *call.config.window), s, -jnp.inf)
    if call.config.score_mod:
        below = BANDS[call.config.score_mod]
        s = jnp.where((j - i <= mods[0][0]) if below else (j - i >= mods[0][0]), s, -jnp.inf)
    return s


def forward(call, q, k, v, *mods):
    CALLS.append(("forward", call.config.window, bool(call.config.score_mod), q.shape[1], k.shape[1]))
    s = logits(call, q, k, mods)
    stats = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - stats[..., None])
    ve = jnp.repeat(v.astype(jnp.float32), q.shape[2] // v.shape[2], axis=2)
    return jnp.einsum("bhqk,bkhd->bqhd", p, ve, precision="highest").astype(q.dtype), stats


def backward(call, q, k, v, o, stats, d_o, *mods):  # cuDNN's formula, with the O and statistics given
    CALLS.append(("backward", call.config.window, bool(call.config.score_mod), q.shape[1], k.shape[1]))
    group = q.shape[2] // k.shape[2]
    f32 = lambda x: x.astype(jnp.float32)
    p = jnp.exp(logits(call, q, k, mods) - stats[..., None])
    ve, ke = (jnp.repeat(f32(x), group, axis=2) for x in (v, k))
    d_p = jnp.einsum("bqhd,bkhd->bhqk", f32(d_o), ve, precision="highest")
    row = jnp.einsum("bqhd,bqhd->bhq", f32(d_o), f32(o))[..., None]
    d_s = p * (d_p - row) * call.scale
    d_q = jnp.einsum("bhqk,bkhd->bqhd", d_s, ke, precision="highest")
    d_k = jnp.einsum("bhqk,bqhd->bkhd", d_s, f32(q), precision="highest")
    d_v = jnp.einsum("bhqk,bqhd->bkhd", p, f32(d_o), precision="highest")
    fold = lambda x: x.reshape(x.shape[:2] + (k.shape[2], group, x.shape[3])).sum(axis=3)
    return d_q.astype(q.dtype), fold(d_k).astype(k.dtype), fold(d_v).astype(v.dtype)


KERNELS.update({FORWARD: forward, BACKWARD: backward})
n = 4
mesh = jax.make_mesh((n,), ("cp",), axis_types=(AxisType.Auto,))
b, s, h_q, d = 2, 128, 4, 32
sink = jnp.linspace(-1.0, 1.0, h_q)
scale = 1 / d ** 0.5


@functools.cache
def inputs(h_kv):
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (b, s, h_q, d)).astype(jnp.bfloat16)
    k, v = (jax.random.normal(key, (b, s, h_kv, d)).astype(jnp.bfloat16) for key in keys[1:3])
    return q, k, v, jax.random.normal(keys[3], (b, s, h_q, d))


def whole_sequence(causal, window, with_sink):
    # Attention of the whole sequence, float32; a sink adds e^sink[h] to each row's sum.
    def whole(q, k, v, sink):
        q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
        group = h_q // k.shape[2]
        ke, ve = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        sc = jnp.einsum("bqhd,bkhd->bhqk", q, ke, precision="highest") * scale
        i, j = jnp.arange(s)[:, None], jnp.arange(s)[None, :]
        sc = jnp.where(visible_window(i, j, *((window[0], 0) if causal else window)), sc, -jnp.inf)
        if with_sink:
            column = jnp.broadcast_to(sink[None, :, None, None], sc.shape[:3] + (1,))
            p = jax.nn.softmax(jnp.concatenate([sc, column], -1), axis=-1)[..., :-1]
        else:
            p = jax.nn.softmax(sc, axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", p, ve, precision="highest")
    return whole


def split_sequence(scheme, causal, balanced, with_sink, window):
    arrange = (lambda x: fj.load_balance(x, n)) if causal and balanced else (lambda x: x)
    restore = (lambda x: fj.unbalance(x, n)) if causal and balanced else (lambda x: x)

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(None, "cp"),) * 3 + (P(),), out_specs=P(None, "cp"))
    def split(q, k, v, sink):
        return fj.context_parallel_attention(q, k, v, axis_name="cp", causal=causal, scheme=scheme,
                                             load_balanced=balanced, sink=sink if with_sink else None,
                                             window=window)

    return lambda q, k, v, sink: restore(split(*(arrange(x) for x in (q, k, v)), sink))


for label, c in CONFIGS.items():
    window = tuple(c["window"])  # the call's window=, (-1, -1): none
    text = check(label, split_sequence(c["scheme"], c["causal"], c["balanced"], c["sink"], window),
                 whole_sequence(c["causal"], window, c["sink"]), (c["causal"], window, c["sink"], c["h_kv"]),
                 c["sink"], *inputs(c["h_kv"]), sink)
    print(label, "PERMUTES", text.count("collective-permute-start") + text.count("collective-permute("))
    print(label, "GATHERS", text.count("all-gather"))
    print(label, "KINDS", sorted(set(CALLS)))
"""


# The children's programs run once on a few thousand elements, and compiling them was nearly all of
# this file's time: LLVM's optimization of the host code halves it (7 s a program to 4) and changes
# nothing the tests look at (the HLO, its collectives, the values to float32 rounding).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def run_program(program, *args):
    """`program` in a child process on 4 host devices: its stdout."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4 " + FAST_COMPILE,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # faulthandler: a crash of the child (JAX 0.11.2's host collectives died with SIGSEGV on the
    # GPU machine) leaves its Python stack in stderr, which the assertion shows.
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", program, *args], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def run_configs(configs, program=CHILD):
    """A context-parallel child (CHILD, or PACKED_CHILD) checking every configuration of `configs`,
    {label: (scheme, causal, balanced, h_kv, with_sink, window)}: {label: its "NAME value" lines as
    a dict}, and the child's stdout."""
    settings = {label: dict(zip(("scheme", "causal", "balanced", "h_kv", "sink", "window"), c))
                for label, c in configs.items()}
    out = run_program(program, json.dumps(settings))
    lines = {label: {} for label in configs}
    for line in out.splitlines():
        label, name, value = line.split(" ", 2)
        lines[label][name] = value
    return lines, out


def assert_close(lines, out):
    # bfloat16 inputs, blocks merged in float32 and rounded to bfloat16 once per partial; GRAD_ERR
    # includes the sink's gradient where there is a sink.
    assert float(lines["OUT_ERR"]) < 1e-2 and float(lines["GRAD_ERR"]) < 2e-2, out


NO_WINDOW = (-1, -1)


def test_outputs_and_gradients_equal_the_whole_sequences():
    # GQA (4 query heads on 2 key/value heads) stands for MHA too: the schedule and the schemes
    # never look at head counts (a block is whatever k and v hold), and the stand-in kernels' MHA is
    # their group of one; GQA's narrower k and v catch a dK shaped or summed as dQ. (The packed test
    # below keeps an MHA case, and fusedattn's own kernels, which do treat them apart, are the GPU
    # tests'.)
    configs = {f"{scheme}_{mode}": (scheme, causal, balanced, 2, False, NO_WINDOW)
               for scheme in ("ring", "all_gather")
               for mode, causal, balanced in (("full", False, False), ("causal_balanced", True, True),
                                              ("causal_contiguous", True, False))}
    results, out = run_configs(configs)
    for label, lines in results.items():
        assert_close(lines, f"{label}\n{out}")
        if label.startswith("ring"):
            assert int(lines["PERMUTES"]) > 0 and lines["GATHERS"] == "0", (label, out)
        else:
            assert int(lines["GATHERS"]) > 0, (label, out)


def test_a_sink_joins_each_row_once_and_its_gradient_is_summed_over_the_devices():
    results, out = run_configs({scheme: (scheme, True, True, 2, True, NO_WINDOW) for scheme in ("ring", "all_gather")})
    for label, lines in results.items():
        assert_close(lines, f"{label}\n{out}")


def test_a_causal_sliding_window_equals_the_whole_sequences():
    # 4 devices of 32 tokens (balanced: chunks of 16): a window inside a chunk, and one across chunks
    # that ends inside one (both need the band pieces); each scheme and layout with each (every
    # combination runs in the PyTorch tests, whose children are cheaper).
    results, out = run_configs({"ring_balanced_window5": ("ring", True, True, 2, False, (5, 0)),
                                "ring_contiguous_window40": ("ring", True, False, 2, False, (40, 0)),
                                "all_gather_balanced_window40": ("all_gather", True, True, 2, False, (40, 0)),
                                "all_gather_contiguous_window5": ("all_gather", True, False, 2, False, (5, 0))})
    for label, lines in results.items():
        assert_close(lines, f"{label}\n{out}")
        assert "True" in lines["KINDS"], (label, out)  # some pieces ran as the band modifier


def test_a_two_sided_window_equals_the_whole_sequences():
    # Not causal, 4 devices of 32 contiguous tokens: bands above the diagonal (keys on later
    # devices) and below it.
    results, out = run_configs({"ring_window5_40": ("ring", False, False, 2, False, (5, 40)),
                                "all_gather_window40_5": ("all_gather", False, False, 2, False, (40, 5))})
    for label, lines in results.items():
        assert_close(lines, f"{label}\n{out}")
        assert "True" in lines["KINDS"], (label, out)


def test_the_traced_window_rule_is_the_shared_one():
    # fusedattn.jax._context_parallel_pieces._window_kind traces _context_parallel.window_piece's comparisons.
    import jax.numpy as jnp
    from fusedattn import _context_parallel as shared
    from fusedattn.jax import _context_parallel_pieces as jcp
    for chunk in (1, 16, 32):
        for bounds in ((1, 0), (5, 0), (16, 0), (40, 0), (100, 0), (5, 40), (40, 5), (-1, 20), (20, -1), (1, 1)):
            for m in range(-8, 9):
                kind, offset = jcp._window_kind(jnp.int32(m), chunk, bounds)
                assert (int(kind), int(offset)) == shared.window_piece(m, chunk, bounds), (m, chunk, bounds)


PACKED_CHILD = CHECK + r"""
LENGTHS = [24, 0, 8, 48]  # multiples of 2N = 8, one empty


def visible(call, cu_q, cu_k, tq, tk, bands):
    # A ragged call's pairs: the same sequence, within it the window (L, R) from the top-left (causal:
    # (-1, 0)), and with the modifier _cp.BANDS_PER_SEQUENCE each sequence's bounds of j - i (its
    # tensors, t0 and t1 by sequence).
    seq = lambda cu, t: jnp.searchsorted(cu[1:], jnp.arange(t), side="right")
    sq, sk = seq(cu_q, tq), seq(cu_k, tk)
    pq, pk = jnp.arange(tq) - cu_q[sq], jnp.arange(tk) - cu_k[sk]
    ok = sq[:, None] == sk[None, :]
    rel = pk[None, :] - pq[:, None]
    left, right = call.config.window
    ok = ok & ((rel > -left) if left >= 0 else True) & ((rel <= right) if right >= 0 else True)
    if call.config.score_mod:
        assert call.config.score_mod == _config.config("thd", score_mod=_cp.BANDS_PER_SEQUENCE).score_mod
        low, high = bands
        ok = ok & (rel >= low[sq][:, None]) & (rel <= high[sq][:, None])
    return ok


def probabilities(call, q, k, cu_q, cu_k, bands, stats=None):
    k = jnp.repeat(k.astype(jnp.float32), q.shape[1] // k.shape[1], axis=1)
    s = jnp.einsum("qhd,khd->hqk", q.astype(jnp.float32), k, precision="highest") * call.scale
    s = jnp.where(visible(call, cu_q, cu_k, q.shape[0], k.shape[0], bands), s, -jnp.inf)
    stats = jax.nn.logsumexp(s, axis=-1) if stats is None else jnp.transpose(stats)  # [h, t]
    return jnp.exp(s - stats[..., None]), jnp.transpose(stats)


def forward(call, q, k, v, cu_q, cu_k, *bands):
    assert call.config.layout == "thd", call.config
    CALLS.append(("forward", q.shape[0], k.shape[0], bool(call.config.score_mod)))
    p, stats = probabilities(call, q, k, cu_q, cu_k, bands)
    ve = jnp.repeat(v.astype(jnp.float32), q.shape[1] // v.shape[1], axis=1)
    return jnp.einsum("hqk,khd->qhd", p, ve, precision="highest").astype(q.dtype), stats


def backward(call, q, k, v, o, stats, d_o, cu_q, cu_k, *bands):  # cuDNN's formula, with the O and statistics given
    group = q.shape[1] // k.shape[1]
    f32 = lambda x: x.astype(jnp.float32)
    p, _ = probabilities(call, q, k, cu_q, cu_k, bands, stats)
    ve, ke = (jnp.repeat(f32(x), group, axis=1) for x in (v, k))
    d_p = jnp.einsum("qhd,khd->hqk", f32(d_o), ve, precision="highest")
    row = jnp.einsum("qhd,qhd->hq", f32(d_o), f32(o))[..., None]
    d_s = p * (d_p - row) * call.scale
    fold = lambda x: x.reshape(x.shape[:1] + (k.shape[1], group, x.shape[2])).sum(axis=2)
    d_q = jnp.einsum("hqk,khd->qhd", d_s, ke, precision="highest")
    d_k = fold(jnp.einsum("hqk,qhd->khd", d_s, f32(q), precision="highest"))
    d_v = fold(jnp.einsum("hqk,qhd->khd", p, f32(d_o), precision="highest"))
    return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype)


KERNELS.update({FORWARD: forward, BACKWARD: backward})
n = 4
mesh = jax.make_mesh((n,), ("cp",), axis_types=(AxisType.Auto,))
t, h_q, d = sum(LENGTHS), 4, 32
cu = jnp.asarray([0] + [sum(LENGTHS[:i + 1]) for i in range(len(LENGTHS))], jnp.int32)
sink = jnp.linspace(-1.0, 1.0, h_q)
scale = 1 / d ** 0.5


@functools.cache
def inputs(h_kv):
    keys = jax.random.split(jax.random.key(1), 4)
    q = jax.random.normal(keys[0], (t, h_q, d)).astype(jnp.bfloat16)
    k, v = (jax.random.normal(key, (t, h_kv, d)).astype(jnp.bfloat16) for key in keys[1:3])
    return q, k, v, jax.random.normal(keys[3], (t, h_q, d))


def each_sequence(causal, window, with_sink):
    # Each sequence's own attention, float32, packed again.
    def whole(q, k, v, sink):
        outs, start = [], 0
        for length in LENGTHS:
            x = [a[start:start + length].astype(jnp.float32) for a in (q, k, v)]
            ke, ve = (jnp.repeat(a, h_q // k.shape[1], axis=1) for a in x[1:])
            sc = jnp.einsum("qhd,khd->hqk", x[0], ke, precision="highest") * scale
            i, j = jnp.arange(length)[:, None], jnp.arange(length)[None, :]
            sc = jnp.where(visible_window(i, j, *((window[0], 0) if causal else window)), sc, -jnp.inf)
            if with_sink:
                column = jnp.broadcast_to(sink[:, None, None], sc.shape[:2] + (1,))
                p = jax.nn.softmax(jnp.concatenate([sc, column], -1), axis=-1)[..., :-1]
            else:
                p = jax.nn.softmax(sc, axis=-1)
            outs.append(jnp.einsum("hqk,khd->qhd", p, ve, precision="highest"))
            start += length
        return jnp.concatenate(outs)
    return whole


def split_sequences(scheme, causal, balanced, with_sink, window):
    arrange = lambda x: fj.load_balance(x, n, cu_seqlens=cu, balanced=causal and balanced)
    restore = lambda x: fj.unbalance(x, n, cu_seqlens=cu, balanced=causal and balanced)

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("cp"),) * 3 + (P(), P()), out_specs=P("cp"))
    def split(q, k, v, sink, cu):
        return fj.context_parallel_attention(q, k, v, axis_name="cp", causal=causal, scheme=scheme,
                                             load_balanced=balanced, sink=sink if with_sink else None, cu_seqlens=cu,
                                             max_seqlen=max(LENGTHS), window=window)

    return lambda q, k, v, sink: restore(split(*(arrange(x) for x in (q, k, v)), sink, cu))


for label, c in CONFIGS.items():
    window = tuple(c["window"])  # the call's window=, (-1, -1): none
    check(label, split_sequences(c["scheme"], c["causal"], c["balanced"], c["sink"], window),
          each_sequence(c["causal"], window, c["sink"]), (c["causal"], window, c["sink"], c["h_kv"]), c["sink"],
          *inputs(c["h_kv"]), sink)
    print(label, "CALLS", sorted(set(CALLS)))
"""


def test_packed_sequences_equal_each_sequences_own_attention():
    # Sequences of 24, 0, 8 and 48 tokens over 4 devices (chunks of 3, 0, 1 and 6 tokens balanced).
    results, out = run_configs({"ring_causal_balanced_gqa": ("ring", True, True, 2, False, NO_WINDOW),
                                "all_gather_causal_balanced_sink": ("all_gather", True, True, 4, True, NO_WINDOW),
                                "ring_full_gqa": ("ring", False, False, 2, False, NO_WINDOW),
                                "all_gather_causal_contiguous": ("all_gather", True, False, 2, False, NO_WINDOW)},
                               program=PACKED_CHILD)
    for label, lines in results.items():
        assert_close(lines, f"{label}\n{out}")
        halves = 10 if "causal_balanced" in label else 20  # each call: one half of a device's 80 / 4 tokens, or all
        assert f"('forward', {halves}, {halves}, False)" in lines["CALLS"], (label, out)


def test_packed_sequences_under_a_window_equal_each_sequences_own_attention():
    # The chunks differ per sequence (3, 0, 1 and 6 tokens balanced; 6, 0, 2 and 12 contiguous), so
    # one piece meets a band in some sequences, the whole pair or nothing in others: the pieces past
    # the diagonal run as the modifier of each sequence's bounds.
    results, out = run_configs({"ring_causal_balanced_window5": ("ring", True, True, 2, False, (5, 0)),
                                "all_gather_causal_contiguous_window9": ("all_gather", True, False, 2, False, (9, 0)),
                                "ring_window4_9": ("ring", False, False, 2, False, (4, 9))}, program=PACKED_CHILD)
    for label, lines in results.items():
        assert_close(lines, f"{label}\n{out}")
        assert "True)" in lines["CALLS"], (label, out)  # some pieces ran as the per-sequence band


def test_packed_orders_are_the_shared_rule_traced():
    # load_balance's and the halves' orders in jnp, against PyTorch's (both _context_parallel's formulas).
    import jax.numpy as jnp
    torch = pytest.importorskip("torch", reason="PyTorch not installed")
    from fusedattn.jax import _context_parallel_order as jcp
    from fusedattn.torch import _context_parallel as tcp
    lengths = [24, 0, 8, 48]
    cu = [0] + [sum(lengths[:i + 1]) for i in range(len(lengths))]
    for balanced in (True, False):
        got = jcp._packed_order(jnp.asarray(cu, jnp.int32), 4, balanced=balanced, tokens=cu[-1])
        want = tcp._packed_order(torch.tensor(cu, dtype=torch.int32), 4, balanced)
        assert [int(x) for x in got] == want.tolist()
    with pytest.raises(Exception) as caught:
        jcp.checked_offsets(jnp.asarray([0, 8, 18], jnp.int32), 2, balanced=True)
    assert "multiples of 4" in str(caught.value)


UNVARYING_CHILD = r"""
import functools, jax, jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec as P
import fusedattn.jax as fj
from fusedattn.jax._calls import BACKWARD, FORWARD
from fusedattn.jax._kernels import KERNELS

# Stand-ins whose results are typed as not varying over the mesh axis, as the core's FFI calls'
# are on the GPU (zeros, not made from the inputs): every lax.switch over piece kinds must still
# type its branches alike.
def forward(call, q, k, v, *rest):
    stats = jnp.zeros((q.shape[0], q.shape[2], q.shape[1]) if q.ndim == 4 else q.shape[:2], jnp.float32)
    return jnp.zeros(q.shape, q.dtype), stats
def backward(call, q, k, v, o, stats, d_o, *rest):
    return jnp.zeros(q.shape, q.dtype), jnp.zeros(k.shape, k.dtype), jnp.zeros(v.shape, v.dtype)
KERNELS.update({FORWARD: forward, BACKWARD: backward})
mesh = jax.make_mesh((4,), ("cp",), axis_types=(AxisType.Auto,))
q, t, cu = jnp.ones((2, 64, 4, 32), jnp.bfloat16), jnp.ones((80, 4, 32), jnp.bfloat16), jnp.asarray([0, 24, 24, 32, 80])
for scheme, causal, balanced, window, packed in (("ring", True, True, (-1, -1), False), ("all_gather", False, False, (5, 9), False),
                                                 ("ring", True, True, (5, 0), True)):
    x = t if packed else q
    spec = P("cp") if packed else P(None, "cp")
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec,) * 3 + (P(),), out_specs=spec)
    def split(q, k, v, cu):
        return fj.context_parallel_attention(q, k, v, axis_name="cp", causal=causal, scheme=scheme, load_balanced=balanced,
                                             window=window, cu_seqlens=cu.astype(jnp.int32) if packed else None,
                                             max_seqlen=48)
    jax.jit(jax.grad(lambda x: split(x, x, x, cu).astype(jnp.float32).sum()))(x).block_until_ready()
    print("COMPILED", scheme, packed)
"""


def test_kernel_results_typed_as_not_varying_still_switch():
    # On the H200 every switch over piece kinds failed to trace ("switch branches must have equal
    # output types"): the FFI calls' results carry no varying mesh axis in their type, a neutral
    # branch's (made from q) does. The stand-ins here return such results.
    out = run_program(UNVARYING_CHILD)
    assert out.count("COMPILED") == 3, out
