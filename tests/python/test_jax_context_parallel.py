"""fusedattn.jax.context_parallel_attention without a GPU: 4 host devices on a mesh axis, the
sequence split across them, ring and all-gather, against attention of the whole sequence (outputs
and gradients). The per-device kernels are plain-JAX stand-ins in fusedattn.jax._kernels.KERNELS
that take and return what the core's FFI calls do; the backward one uses the O and statistics it is
given, as cuDNN's does, so the test holds the merged statistics the algorithm hands each block.

Each test runs one child process (JAX's import and 4 host devices are seconds of it) that checks
all its configurations: one compiled program a configuration (the output comes with the gradients,
and the collectives are counted in that program's text), one jitted reference a set of inputs,
shared by ring and all-gather (jax_cp_check.py). Packed sequences:
test_jax_context_parallel_packed.py."""
import pytest

pytest.importorskip("jax", reason="JAX not installed")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")

from jax_cp_check import CHECK, NO_WINDOW, assert_close, run_configs  # noqa: E402

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
    results, out = run_configs(configs, program=CHILD)
    for label, lines in results.items():
        assert_close(lines, f"{label}\n{out}")
        if label.startswith("ring"):
            assert int(lines["PERMUTES"]) > 0 and lines["GATHERS"] == "0", (label, out)
        else:
            assert int(lines["GATHERS"]) > 0, (label, out)


def test_a_causal_sliding_window_equals_the_whole_sequences():
    # 4 devices of 32 tokens (balanced: chunks of 16): a window inside a chunk, and one across chunks
    # that ends inside one (both need the band pieces); each scheme and layout with each (every
    # combination runs in the PyTorch tests, whose children are cheaper).
    results, out = run_configs({"ring_balanced_window5": ("ring", True, True, 2, False, (5, 0)),
                                "ring_contiguous_window40": ("ring", True, False, 2, False, (40, 0)),
                                "all_gather_balanced_window40": ("all_gather", True, True, 2, False, (40, 0)),
                                "all_gather_contiguous_window5": ("all_gather", True, False, 2, False, (5, 0))},
                               program=CHILD)
    for label, lines in results.items():
        assert_close(lines, f"{label}\n{out}")
        assert "True" in lines["KINDS"], (label, out)  # some pieces ran as the band modifier


def test_a_sink_joins_each_row_once_and_its_gradient_is_summed_over_the_devices():
    results, out = run_configs({scheme: (scheme, True, True, 2, True, NO_WINDOW) for scheme in ("ring", "all_gather")},
                               program=CHILD)
    for label, lines in results.items():
        assert_close(lines, f"{label}\n{out}")


def test_a_two_sided_window_equals_the_whole_sequences():
    # Not causal, 4 devices of 32 contiguous tokens: bands above the diagonal (keys on later
    # devices) and below it.
    results, out = run_configs({"ring_window5_40": ("ring", False, False, 2, False, (5, 40)),
                                "all_gather_window40_5": ("all_gather", False, False, 2, False, (40, 5))},
                               program=CHILD)
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
