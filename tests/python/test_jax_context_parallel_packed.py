"""fusedattn.jax.context_parallel_attention on packed sequences (thd) without a GPU: 4 host devices
on a mesh axis, each holding its chunks of every sequence, ring and all-gather, against each
sequence's own attention (outputs and gradients), with the plain-JAX stand-in kernels of a ragged
call; one child process a test, as in test_jax_context_parallel.py (jax_cp_check.py). And the
packed orders traced in jnp against PyTorch's."""
import pytest

pytest.importorskip("jax", reason="JAX not installed")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")

from jax_cp_check import CHECK, NO_WINDOW, assert_close, run_configs  # noqa: E402

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
