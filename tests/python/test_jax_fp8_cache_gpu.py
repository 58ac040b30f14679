"""fusedattn.jax.paged_attention over FP8 (E4M3) caches on a GPU, under jit, against XLA's float32
attention on the dequantized gathered keys: descales per tensor and per K/V head, one and four query
tokens a sequence, ragged lengths (1, a page plus one, a full cache)."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
if not any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("no GPU visible to JAX", allow_module_level=True)
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built")
import jax.numpy as jnp  # noqa: E402


def rel(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def quantized(x, per_head):
    """x [pages, page, h_kv, d] in E4M3 with its float32 descales ([] or [h_kv]): x ~ x8 * descale."""
    amax = jnp.abs(x).max(axis=(0, 1, 3)) if per_head else jnp.abs(x).max()
    descale = amax / 448.0
    return (x / (descale[:, None] if per_head else descale)).astype(jnp.float8_e4m3fn), descale


@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
def test_fp8_caches_match_xla_on_the_dequantized_cache(per_head):
    b, per_seq, page, h_q, h_kv, d = 3, 64, 64, 32, 8, 128
    s_kv = per_seq * page
    keys = jax.random.split(jax.random.key(61), 4)
    (k_pool, descale_k), (v_pool, descale_v) = (
        quantized(jax.random.normal(key, (b * per_seq, page, h_kv, d)), per_head) for key in keys[:2])
    table = jax.random.permutation(keys[2], b * per_seq).reshape(b, per_seq).astype(jnp.int32)
    lengths = jnp.array([s_kv, 1, page + 1], jnp.int32)
    call = jax.jit(lambda q, kp, vp, t, n, dk, dv: fj.paged_attention(q, kp, vp, t, t, n, descale_k=dk, descale_v=dv))
    for s_q in (1, 4):
        q = jax.random.normal(keys[3], (b, s_q, h_q, d)).astype(jnp.bfloat16)
        out = call(q, k_pool, v_pool, table, lengths, descale_k, descale_v)
        assert out.dtype == q.dtype and out.shape == q.shape
        for i in range(b):
            n = int(lengths[i])
            if n < s_q:
                continue  # bottom-right causal: rows with no key
            k_i, v_i = ((pool[table[i]].reshape(s_kv, h_kv, d)[:n].astype(jnp.float32)
                         * (descale[:, None] if per_head else descale))[None]
                        for pool, descale in ((k_pool, descale_k), (v_pool, descale_v)))
            ref = jax.nn.dot_product_attention(q[i:i + 1].astype(jnp.float32), k_i, v_i,
                                               mask=jnp.tril(jnp.ones((s_q, n), bool), n - s_q)[None, None],
                                               implementation="xla")
            assert rel(out[i:i + 1], ref) < 1e-2, (s_q, i, n)
