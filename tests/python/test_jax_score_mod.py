"""fusedattn.jax's score_mod without a GPU: jax.numpy functions traced into the core's expressions,
what they cannot express named, the expression and its arrays in the exported calls, learned terms
as a bias with its gradient, vmap, and meshes that must keep the batch or head axis whole."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402

import fusedattn  # noqa: E402
from jax_shapes import exported_text, shaped  # noqa: E402


SLOPES = jnp.linspace(0.0, 0.5, 4)


def test_score_mod_functions_trace_into_expressions():
    from fusedattn.jax._score_mod import trace
    cases = [
        (lambda s, b, h, q, kv: 30.0 * jnp.tanh(s / 30.0), "mul($0,tanh(div(score,$0)))", (30.0,)),
        (lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q), "add(score,mul(t0[h],sub(kv,q)))", ()),
        (lambda s, b, h, q, kv: jnp.where((kv <= q) | (kv < 16), s, -jnp.inf),
         "select(or(le(kv,q),lt(kv,$0)),score,-inf)", (16.0,)),
        (lambda s, b, h, q, kv: s ** 2 + jax.nn.sigmoid(s), "add(pow(score,2),sigmoid(score))", ()),
    ]
    for fn, text, scalars in cases:
        traced, _ = trace(fn)
        assert (traced.text, traced.scalars) == (text, scalars)


def t5_bucket(relative, num_buckets=32, max_distance=128):
    """T5's bidirectional relative-position bucket in jax.numpy: integer division, casts, a clamp."""
    num_buckets //= 2
    buckets = (relative > 0).astype(jnp.int32) * num_buckets
    relative = jnp.abs(relative)
    max_exact = num_buckets // 2
    large = max_exact + (jnp.log(relative.astype(jnp.float32) / max_exact) / jnp.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(relative < max_exact, relative, large)


@pytest.mark.parametrize("name, fn", [
    ("t5", lambda s, b, h, qi, kv, table: s + table[t5_bucket(kv - qi), h]),
    ("blocks and remainders", lambda s, b, h, qi, kv, table: s + table[(kv // 64 - qi // 64) % 32, h]
     + table[(kv - qi) % 5, h] * (kv // 3 == qi // 3)),
])
def test_index_arithmetic_traces_into_a_bias_equal_to_the_function(name, fn):
    # Integer // and %, casts toward zero (astype(int32) of a float: not a rounding) and clamps, as
    # JAX lowers them (lax.div and lax.rem round toward zero; jnp corrects them with sign): the
    # table's terms run as the call's bias, evaluated on index grids, equal to the function there.
    from fusedattn.jax import _score_mod as _jax_score_mod
    table = jax.random.normal(jax.random.key(3), (32, 4))
    bound = lambda s, b, h, qi, kv: fn(s, b, h, qi, kv, table)
    traced, stopped = _jax_score_mod.trace(bound)
    assert traced.bias is not None and traced.bias.text, name
    q, k = jnp.zeros((1, 150, 4, 64)), jnp.zeros((1, 200, 4, 64))
    bias, _ = _jax_score_mod.dense_bias(traced.bias, q, k, layout="bshd", stopped=stopped)
    qi, kv = jnp.arange(150)[:, None], jnp.arange(200)[None, :]
    want = jax.vmap(lambda h: fn(0.0, 0, h, qi, kv, table))(jnp.arange(4))[None]  # [1, h, s_q, s_kv]
    assert bias.shape == want.shape, (bias.shape, want.shape)
    assert jnp.array_equal(bias.astype(jnp.float32), want.astype(jnp.float32)), name


def test_mask_mod_beside_score_mod_traces_into_one_expression():
    from fusedattn.jax._score_mod import trace, with_mask
    prefix_lm = lambda b, h, q, kv: (q >= kv) | (kv < 256)  # noqa: E731
    softcap = lambda s, b, h, q, kv: 30.0 * jnp.tanh(s / 30.0)  # noqa: E731
    traced, _ = trace(with_mask(None, prefix_lm))
    assert (traced.text, traced.scalars) == ("select(or(ge(q,kv),lt(kv,$0)),score,-inf)", (256.0,))
    traced, _ = trace(with_mask(softcap, prefix_lm))  # as one function
    assert traced.text == "select(or(ge(q,kv),lt(kv,$0)),mul($1,tanh(div(score,$1))),-inf)"
    from fusedattn.jax._score_mod import trace_masked
    traced, _ = trace_masked(softcap, prefix_lm)  # apart, then composed: the modifier's slots first
    assert (traced.text, traced.scalars) == ("select(or(ge(q,kv),lt(kv,$1)),mul($0,tanh(div(score,$0))),-inf)",
                                             (30.0, 256.0))
    q = shaped(2, 512, 4, 64)
    out = jax.eval_shape(lambda q: fj.attention(q, q, q, score_mod=softcap, mask_mod=prefix_lm), q)
    assert out.shape == q.shape
    # A mask that is cuDNN's own band runs as it: no condition in the call.
    from fusedattn.jax._score_mod import mask_band
    assert mask_band(lambda b, h, q, kv: q >= kv) == -1
    assert mask_band(lambda b, h, q, kv: (q >= kv) & (q - kv < 128)) == 128
    assert mask_band(prefix_lm) is None
    text = exported_text(lambda q: fj.attention(q, q, q, mask_mod=lambda b, h, qi, kv: (qi >= kv) & (qi - kv < 128)), q)
    assert "window=128,0" in text and "score_mod=" not in text


def test_score_mod_primitives_it_cannot_express_are_named():
    q = shaped(2, 64, 4, 64)
    for fn, words in [(lambda s, b, h, qi, kv: jax.scipy.special.erf(s), "the JAX primitive erf"),
                      (lambda s, b, h, qi, kv: s * SLOPES[kv - qi], "gathers from a tensor")]:
        with pytest.raises(fusedattn.NotSupportedError) as caught:
            jax.eval_shape(lambda q: fj.attention(q, q, q, score_mod=fn), q)
        assert words in str(caught.value)


def test_score_mod_reaches_the_spec_and_its_arrays_the_calls():
    q = shaped(2, 64, 4, 64)

    def loss(q, slopes):
        fn = lambda s, b, h, qi, kv: 2.0 * jnp.tanh(s / 2.0) + jax.lax.stop_gradient(slopes)[h] * (kv - qi)
        return fj.attention(q, q, q, causal=True, score_mod=fn).astype(jnp.float32).sum()
    grads = jax.eval_shape(jax.grad(loss), q, shaped(4, dtype=jnp.float32))
    assert grads.shape == q.shape
    text = exported_text(jax.grad(loss), q, shaped(4, dtype=jnp.float32))
    assert "score_mod=add(mul($0,tanh(div(score,$0))),mul(t0[h],sub(kv,q)))" in text
    # the scalars (float32 [1]) and the slopes (float32 [4]) are operands of both calls
    assert text.count("tensor<1xf32>, tensor<4xf32>") >= 2


def test_score_mod_arrays_under_differentiation_run_as_a_bias_with_its_gradient():
    # A learned term added to the score runs as the call's bias (dBias flows back into the array);
    # one that multiplies the score is refused, naming the term.
    q = shaped(2, 64, 4, 64)

    def gradient_of(fn):
        return jax.grad(lambda q, table: fj.attention(
            q, q, q, score_mod=lambda s, b, h, qi, kv: fn(s, table, h, qi, kv)).astype(jnp.float32).sum(), argnums=1)
    added = gradient_of(lambda s, table, h, qi, kv: s + table[h, jnp.clip(kv - qi, -8, 8) + 8])
    assert jax.eval_shape(added, q, shaped(4, 17, dtype=jnp.float32)).shape == (4, 17)
    text = exported_text(added, q, shaped(4, 17, dtype=jnp.float32))
    assert "bias=1hss" in text and "bias_grad=1" in text and "score_mod=" not in text
    multiplied = gradient_of(lambda s, table, h, qi, kv: s * table[h, 0])
    with pytest.raises(fusedattn.NotSupportedError) as caught:
        jax.eval_shape(multiplied, q, shaped(4, 17, dtype=jnp.float32))
    assert "reads one that needs a gradient" in str(caught.value)


def test_a_table_read_inside_jit_is_taken_as_learned():
    # jax.grad of a jitted call traces the function with jaxpr tracers, not JVP tracers: a table
    # read there must still get its gradient (on the H200, JAX 0.11 gave it zeros when it did not).
    q = shaped(2, 64, 4, 64)
    call = jax.jit(lambda q, table: fj.attention(
        q, q, q, score_mod=lambda s, b, h, qi, kv: s + table[h, jnp.clip(kv - qi, -8, 8) + 8]))
    gradient = jax.grad(lambda q, table: call(q, table).astype(jnp.float32).sum(), argnums=1)
    text = exported_text(gradient, q, shaped(4, 17, dtype=jnp.float32))
    assert "bias=1hss" in text and "bias_grad=1" in text
    # stop_gradient says the array is not learned: no dBias then
    frozen = jax.jit(lambda q, table: fj.attention(
        q, q, q, score_mod=lambda s, b, h, qi, kv: s + jax.lax.stop_gradient(table)[h, jnp.clip(kv - qi, -8, 8) + 8]))
    text = exported_text(jax.grad(lambda q, t: frozen(q, t).astype(jnp.float32).sum()), q,
                         shaped(4, 17, dtype=jnp.float32))
    assert "bias=1hss" in text and "bias_grad=1" not in text


def test_vmap_of_a_score_modified_call_runs_per_element():
    # Folding the mapped axis into the batch would move each element's b index: one call each.
    q = shaped(3, 2, 64, 4, 64)
    fn = lambda s, b, h, qi, kv: s + 0.5 * b

    def each(q):
        return fj.attention(q, q, q, score_mod=fn)
    assert jax.eval_shape(jax.vmap(each), q).shape == q.shape
    text = exported_text(jax.vmap(each), q)
    assert "score_mod=add(score,mul($0,b))" in text and "while" in text  # lax.map, not one larger call


def test_a_modifier_reading_the_batch_or_head_index_keeps_that_axis_whole_under_a_mesh():
    # Each shard would see its own b and h: only their use as numbers forbids the split; indexing
    # the modifier's tensors by them is right (the tensors are split with q).
    from fusedattn.jax._partition import _reads_index
    assert not _reads_index("add(score,mul(t0[h],sub(kv,q)))", "h")
    assert _reads_index("select(ne(h,1),score,abs(score))", "h")
    assert _reads_index("add(score,mul($0,b))", "b") and not _reads_index("add(score,t0[b,h])", "b")
    assert not _reads_index("mul(tanh(div(score,$0)),$0)", "h")  # tanh and abs hold no index
