"""fusedattn.jax on a GPU, against jax.nn.dot_product_attention(implementation="xla") in float32
(upcast inputs) for outputs and gradients, under jit."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
if not any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("no GPU visible to JAX", allow_module_level=True)
fj = pytest.importorskip("fusedattn.jax")
import fusedattn.errors  # noqa: E402
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")
import jax.numpy as jnp  # noqa: E402

TOLERANCE = {jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def rel(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_xla_attention_in_float32(dtype, causal):
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.uniform(keys[0], (2, 333, 8, 128), minval=-1, maxval=1).astype(dtype)
    k = jax.random.uniform(keys[1], (2, 333, 2, 128), minval=-1, maxval=1).astype(dtype)
    v = jax.random.uniform(keys[2], (2, 333, 2, 128), minval=-1, maxval=1).astype(dtype)
    d_o = jax.random.uniform(keys[3], (2, 333, 8, 128), minval=-1, maxval=1)

    def ours(q, k, v):
        return (fj.attention(q, k, v, causal=causal).astype(jnp.float32) * d_o).sum()

    def reference(q, k, v):
        f32 = [x.astype(jnp.float32) for x in (q, k, v)]
        return (jax.nn.dot_product_attention(*f32, is_causal=causal, implementation="xla") * d_o).sum()

    out = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=causal))(q, k, v)
    ref = jax.nn.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), is_causal=causal,
                                       implementation="xla")
    assert rel(out, ref) < TOLERANCE[dtype]
    grads = jax.jit(jax.grad(ours, (0, 1, 2)))(q, k, v)
    ref_grads = jax.jit(jax.grad(reference, (0, 1, 2)))(q, k, v)
    for g, r in zip(grads, ref_grads):
        assert rel(g, r) < TOLERANCE[dtype]


def random_qkv(dtype, shape_q=(2, 200, 8, 64), heads_kv=2, seed=1):
    keys = jax.random.split(jax.random.key(seed), 3)
    shape_kv = shape_q[:2] + (heads_kv, shape_q[3])
    return tuple(jax.random.uniform(key, shape, minval=-1, maxval=1).astype(dtype)
                 for key, shape in zip(keys, (shape_q, shape_kv, shape_kv)))


def xla_attention(q, k, v, causal=False):
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    return jax.nn.dot_product_attention(*f32, is_causal=causal, implementation="xla")


def test_vmap_and_checkpoint_match_per_element_calls():
    q, k, v = (jnp.stack([x, x[::-1]]) for x in random_qkv(jnp.bfloat16))  # a mapped axis of 2
    out = jax.jit(jax.vmap(lambda q, k, v: fj.attention(q, k, v, causal=True)))(q, k, v)
    for i in range(2):
        assert rel(out[i], xla_attention(q[i], k[i], v[i], causal=True)) < TOLERANCE[jnp.bfloat16]

    def loss(q, k, v):
        return jax.checkpoint(lambda q, k, v: fj.attention(q, k, v).astype(jnp.float32).sum())(q, k, v)

    def ref_loss(q, k, v):
        return xla_attention(q, k, v).sum()

    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q[0], k[0], v[0])
    ref_grads = jax.grad(ref_loss, (0, 1, 2))(q[0], k[0], v[0])
    for g, r in zip(grads, ref_grads):
        assert rel(g, r) < TOLERANCE[jnp.bfloat16]


def test_not_supported_raises_while_tracing():
    q, k, v = random_qkv(jnp.bfloat16, shape_q=(1, 64, 2, 512), heads_kv=2)  # d = 512: beyond cuDNN
    with pytest.raises(fusedattn.errors.NotSupportedError, match="d"):
        jax.jit(fj.attention)(q, k, v)


COMMAND_BUFFER_CHILD = r"""
import jax, jax.numpy as jnp
import fusedattn.jax as fj
from fusedattn import _jax_ffi
keys = jax.random.split(jax.random.key(3), 3)
q, k, v = (jax.random.uniform(key, (2, 256, 8, 64), minval=-1, maxval=1).astype(jnp.bfloat16) for key in keys)
step = jax.jit(lambda q, k, v: jax.grad(lambda q, k, v: fj.attention(q, k, v, causal=True).astype(jnp.float32).sum(),
                                        (0, 1, 2))(q, k, v))
first = step(q, k, v)
for _ in range(3):
    again = step(q, k, v)  # replays of the recorded graph
jax.block_until_ready(again)
# The handlers count executions whose stream was capturing: XLA records command buffers so.
print("CAPTURED", _jax_ffi.captured_executions())
print("SAME", all(bool(jnp.array_equal(a, b)) for a, b in zip(first, again)))
"""


def test_runs_inside_an_xla_command_buffer():
    import os
    import subprocess
    import sys
    env = dict(os.environ, XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                                     "--xla_gpu_graph_min_graph_size=1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the same fusedattn as this test's
    done = subprocess.run([sys.executable, "-c", COMMAND_BUFFER_CHILD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    captured = int(done.stdout.split("CAPTURED ")[1].split()[0])
    assert captured >= 2, done.stdout  # forward and backward were recorded into a command buffer
    assert "SAME True" in done.stdout, done.stdout


def test_vmapped_gradients_in_sbhd_match_per_element_gradients():
    q, k, v = (jnp.stack([jnp.swapaxes(x, 0, 1), jnp.swapaxes(x[::-1], 0, 1)]) for x in random_qkv(jnp.float16, seed=5))
    d_o = jax.random.uniform(jax.random.key(9), q.shape, minval=-1, maxval=1)  # [2, s, b, h, d]

    def loss(q, k, v, d_o):
        return (fj.attention(q, k, v, layout="sbhd", causal=True).astype(jnp.float32) * d_o).sum()

    grads = jax.jit(jax.vmap(jax.grad(loss, (0, 1, 2))))(q, k, v, d_o)
    for i in range(2):
        def ref_loss(q, k, v):
            as_bshd = [jnp.swapaxes(x, 0, 1) for x in (q, k, v)]
            return (jnp.swapaxes(xla_attention(*as_bshd, causal=True), 0, 1) * d_o[i]).sum()
        ref = jax.grad(ref_loss, (0, 1, 2))(q[i], k[i], v[i])
        for g, r in zip(grads, ref):
            assert rel(g[i], r) < TOLERANCE[jnp.float16]


@pytest.mark.skipif(len(jax.devices("gpu")) < 2, reason="needs two or more GPUs visible to JAX")
def test_sharded_over_gpus_matches_one_gpu():
    from jax.sharding import NamedSharding, PartitionSpec as P
    gpus = jax.devices("gpu")
    shape = (2, 2) if len(gpus) >= 4 else (1, 2)  # data- and head-parallel where four GPUs are there
    mesh = jax.make_mesh(shape, ("data", "model"), devices=gpus[:shape[0] * shape[1]])
    q, k, v = random_qkv(jnp.bfloat16, shape_q=(4, 256, 8, 64), heads_kv=4, seed=11)
    d_o = jax.random.uniform(jax.random.key(12), q.shape, minval=-1, maxval=1).astype(jnp.bfloat16)
    spec = NamedSharding(mesh, P("data", None, "model", None))

    def loss(q, k, v):
        return (fj.attention(q, k, v, causal=True).astype(jnp.float32) * d_o.astype(jnp.float32)).sum()

    step = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))
    one = step(q, k, v)
    sharded = step(*(jax.device_put(x, spec) for x in (q, k, v)))
    assert "all-gather" not in step.lower(*(jax.device_put(x, spec) for x in (q, k, v))).compile().as_text()
    assert abs(float(one[0]) - float(sharded[0])) <= 1e-3 * abs(float(one[0]))
    for a, b in zip(one[1], sharded[1]):
        assert rel(b, a) < 1e-3  # the same kernels on the same rows: only the order of sums may differ


def test_bias_and_its_gradient_match_xla_with_the_same_bias():
    q, k, v = random_qkv(jnp.bfloat16, shape_q=(2, 160, 4, 64), heads_kv=4, seed=21)
    for bias_shape in ((2, 4, 160, 160), (1, 4, 160, 160)):  # bhss, 1hss
        bias = jax.random.normal(jax.random.key(22), bias_shape).astype(jnp.bfloat16)
        d_o = jax.random.uniform(jax.random.key(23), q.shape, minval=-1, maxval=1)

        def ours(q, k, v, bias):
            return (fj.attention(q, k, v, bias=bias, causal=True).astype(jnp.float32) * d_o).sum()

        def reference(q, k, v, bias):
            f32 = [x.astype(jnp.float32) for x in (q, k, v, bias)]
            return (jax.nn.dot_product_attention(*f32[:3], bias=f32[3], is_causal=True, implementation="xla")
                    * d_o).sum()
        grads = jax.jit(jax.grad(ours, (0, 1, 2, 3)))(q, k, v, bias)
        ref = jax.grad(reference, (0, 1, 2, 3))(q, k, v, bias)
        for g, r in zip(grads, ref):
            assert rel(g, r) < TOLERANCE[jnp.bfloat16], bias_shape


def sink_reference(q, k, v, sink):
    """float32 attention of bshd q, k, v (no mask) with e^sink[h] in each row's denominator."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    k, v = (jnp.repeat(x, q.shape[2] // k.shape[2], axis=2) for x in (k, v))
    logits = jnp.einsum("bshd,bthd->bhst", q, k) / q.shape[-1] ** 0.5
    logits = jnp.concatenate([logits, jnp.broadcast_to(sink[None, :, None, None], logits.shape[:3] + (1,))], -1)
    p = jax.nn.softmax(logits, axis=-1)[..., :-1]  # the sink takes its share and no value
    return jnp.einsum("bhst,bthd->bshd", p, v)


def test_sink_softmax_and_its_gradient():
    q, k, v = random_qkv(jnp.float16, shape_q=(1, 130, 4, 64), heads_kv=2, seed=31)
    sink = jax.random.normal(jax.random.key(32), (4,))
    out = jax.jit(lambda q, k, v, s: fj.attention(q, k, v, softmax="sink", sink=s))(q, k, v, sink)
    assert rel(out, sink_reference(q, k, v, sink)) < TOLERANCE[jnp.float16]
    d_sink = jax.grad(lambda s: fj.attention(q, k, v, softmax="sink", sink=s).astype(jnp.float32).sum())(sink)
    ref_d_sink = jax.grad(lambda s: sink_reference(q, k, v, s).sum())(sink)
    assert rel(d_sink, ref_d_sink) < 1e-2


@pytest.mark.parametrize("keys", [6, 3000])
def test_a_sink_in_a_decode_step_runs_on_the_decode_kernel(keys):
    # One query row, which cuDNN refuses beside a sink: fusedattn's decode kernel adds the sink itself
    # (6 keys: the sink, drawn in [-3, 3], weighs as much as they do).
    q, _, _ = random_qkv(jnp.bfloat16, shape_q=(2, 1, 8, 64), heads_kv=2, seed=33)
    _, k, v = random_qkv(jnp.bfloat16, shape_q=(2, keys, 8, 64), heads_kv=2, seed=34)
    sink = jax.random.uniform(jax.random.key(35), (8,), minval=-3, maxval=3)
    out = jax.jit(lambda q, k, v, s: fj.attention(q, k, v, causal=True, align="bottom_right", softmax="sink",
                                                  sink=s))(q, k, v, sink)
    assert rel(out, sink_reference(q, k, v, sink)) < TOLERANCE[jnp.bfloat16]


def test_dropout_replays_with_the_key_and_the_backward_uses_the_forward_mask():
    q, k, v = random_qkv(jnp.bfloat16, shape_q=(2, 300, 4, 64), heads_kv=4, seed=41)
    d_o = jax.random.uniform(jax.random.key(42), q.shape, minval=-1, maxval=1).astype(jnp.bfloat16)

    def step(q, k, v, key):
        out, pullback = jax.vjp(lambda q, k, v: fj.attention(q, k, v, dropout_rate=0.2, dropout_key=key), q, k, v)
        return out, pullback(d_o)
    step = jax.jit(step)
    out, grads = step(q, k, v, jax.random.key(7))
    again, _ = step(q, k, v, jax.random.key(7))
    other, _ = step(q, k, v, jax.random.key(8))
    assert jnp.array_equal(out, again) and not jnp.array_equal(out, other)
    # With the forward's mask, sum(dV * V) = sum(dO * O) holds exactly (up to rounding).
    lhs = float((grads[2].astype(jnp.float32) * v.astype(jnp.float32)).sum())
    rhs = float((d_o.astype(jnp.float32) * out.astype(jnp.float32)).sum())
    assert abs(lhs - rhs) < 1e-2 * max(1.0, abs(rhs))


def test_packed_sequences_match_each_sequence_alone():
    lengths = [37, 128, 1, 200]
    cu = jnp.array([0] + list(jnp.cumsum(jnp.array(lengths))), jnp.int32)
    q, k, v = (x.reshape(-1, 4, 64) for x in random_qkv(jnp.bfloat16, shape_q=(1, sum(lengths), 4, 64), heads_kv=4))
    out = jax.jit(lambda q, k, v, cu: fj.attention(q, k, v, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                                   max_seqlen_q=200, max_seqlen_kv=200, causal=True))(q, k, v, cu)
    for start, n in zip(cu[:-1].tolist(), lengths):
        piece = slice(start, start + n)
        ref = xla_attention(q[None, piece], k[None, piece], v[None, piece], causal=True)[0]
        assert rel(out[piece], ref) < TOLERANCE[jnp.bfloat16], n


@pytest.mark.parametrize("cache_layout", ["bshd", "sbhd"])
def test_paged_decode_matches_attention_on_the_gathered_cache(cache_layout):
    b, page, pages, h_q, h_kv, d = 3, 16, 6, 8, 2, 128
    lengths = jnp.array([1, 50, 96], jnp.int32)
    keys = jax.random.split(jax.random.key(51), 4)
    pool_shape = (40, page, h_kv, d) if cache_layout == "bshd" else (page, 40, h_kv, d)
    k_pool, v_pool = (jax.random.uniform(key, pool_shape, minval=-1, maxval=1).astype(jnp.bfloat16) for key in keys[:2])
    table = jax.random.permutation(keys[2], 40)[: b * pages].reshape(b, pages).astype(jnp.int32)
    q = jax.random.uniform(keys[3], (b, 4, h_q, d), minval=-1, maxval=1).astype(jnp.bfloat16)  # 4 new tokens
    out = jax.jit(lambda q, kp, vp, t, n: fj.paged_attention(q, kp, vp, t, t, n, cache_layout=cache_layout))(
        q, k_pool, v_pool, table, lengths)

    def gathered(pool, i):  # sequence i's tokens, in order, as [s, h_kv, d]
        pages_first = pool if cache_layout == "bshd" else jnp.swapaxes(pool, 0, 1)
        return pages_first[table[i]].reshape(pages * page, h_kv, d)[: int(lengths[i])]
    for i in range(b):
        n = int(lengths[i])
        if n < 4:
            continue  # bottom-right causal: fewer keys than new queries leaves rows with no key
        k_i, v_i = (gathered(pool, i)[None].astype(jnp.float32) for pool in (k_pool, v_pool))
        ref = jax.nn.dot_product_attention(q[i:i + 1].astype(jnp.float32), k_i, v_i,
                                           mask=jnp.tril(jnp.ones((4, n), bool), n - 4)[None, None],
                                           implementation="xla")
        assert rel(out[i:i + 1], ref) < TOLERANCE[jnp.bfloat16], i


def test_split_decodes_dense_and_ragged_match_xla():
    """Calls the split decode takes on an H200 (support/decode_split.h): one query a sequence at b = 3
    over 4096-token caches (10 chunks), and ragged queries (1, 0 and 3 a sequence, thd: 5 chunks and
    the masked call), each against XLA's float32 attention on the sequence's gathered keys."""
    page, per_seq, h_q, h_kv, d = 64, 64, 32, 8, 128
    b = 3
    keys = jax.random.split(jax.random.key(53), 4)
    k_pool, v_pool = (jax.random.uniform(key, (b * per_seq, page, h_kv, d), minval=-1, maxval=1).astype(jnp.bfloat16)
                      for key in keys[:2])
    table = jax.random.permutation(keys[2], b * per_seq).reshape(b, per_seq).astype(jnp.int32)
    lengths = jnp.array([4096, 0, 2001], jnp.int32)

    def reference(q_i, i):  # q_i [1, s, h_q, d]: bottom-right causal over sequence i's keys
        n, s = int(lengths[i]), q_i.shape[1]
        k_i, v_i = (pool[table[i]].reshape(per_seq * page, h_kv, d)[:n][None].astype(jnp.float32)
                    for pool in (k_pool, v_pool))
        return jax.nn.dot_product_attention(q_i.astype(jnp.float32), k_i, v_i,
                                            mask=jnp.tril(jnp.ones((s, n), bool), n - s)[None, None],
                                            implementation="xla")

    q = jax.random.uniform(keys[3], (b, 1, h_q, d), minval=-1, maxval=1).astype(jnp.bfloat16)
    out = jax.jit(lambda q, t, n: fj.paged_attention(q, k_pool, v_pool, t, t, n))(q, table, lengths)
    for i in (0, 2):
        assert rel(out[i:i + 1], reference(q[i:i + 1], i)) < TOLERANCE[jnp.bfloat16], i
    queries, cu = [1, 0, 3], jnp.array([0, 1, 1, 4], jnp.int32)
    q = jax.random.uniform(keys[3], (sum(queries), h_q, d), minval=-1, maxval=1).astype(jnp.bfloat16)
    out = jax.jit(lambda q, t, n, cu: fj.paged_attention(q, k_pool, v_pool, t, t, n, layout="thd", cu_seqlens_q=cu,
                                                         max_seqlen_q=3))(q, table, lengths, cu)
    for i in (0, 2):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        assert rel(out[rows][None], reference(q[rows][None], i)) < TOLERANCE[jnp.bfloat16], i


def test_runtime_lengths_match_each_entry_alone():
    q, k, v = random_qkv(jnp.float16, shape_q=(3, 160, 4, 64), heads_kv=4, seed=61)
    len_q, len_kv = jnp.array([160, 37, 1], jnp.int32), jnp.array([160, 100, 64], jnp.int32)
    out = jax.jit(lambda q, k, v, a, b: fj.attention(q, k, v, seq_len_q=a, seq_len_kv=b))(q, k, v, len_q, len_kv)
    for i in range(3):
        n_q, n_kv = int(len_q[i]), int(len_kv[i])
        ref = xla_attention(q[i:i + 1, :n_q], k[i:i + 1, :n_kv], v[i:i + 1, :n_kv])
        assert rel(out[i:i + 1, :n_q], ref) < TOLERANCE[jnp.float16], i
        assert not jnp.any(out[i, n_q:]), i  # zero past the entry's length


def test_max_logit_per_row_and_per_head():
    q, k, v = random_qkv(jnp.bfloat16, shape_q=(2, 200, 4, 64), heads_kv=4, seed=71)
    scores = jnp.einsum("bshd,bthd->bhst", q.astype(jnp.float32), k.astype(jnp.float32)) / 8.0
    expected = jnp.where(jnp.tril(jnp.ones((200, 200), bool)), scores, -jnp.inf).max(axis=-1)
    _, rows = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=True, return_max_logit="row"))(q, k, v)
    _, heads = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=True, return_max_logit="head"))(q, k, v)
    assert rel(rows, expected) < 1e-3
    assert rel(heads, expected.max(axis=(0, 2))) < 1e-3
