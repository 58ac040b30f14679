"""fusedattn.jax without a GPU: shapes through jax.eval_shape (forward, grad, vmap), errors at
trace time, and the program exported for CUDA: the FFI custom calls with the spec attribute."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402

import fusedattn  # noqa: E402


def shaped(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_forward_and_gradient_shapes():
    q, k, v = shaped(2, 100, 8, 64), shaped(2, 150, 2, 64), shaped(2, 150, 2, 32)
    out = jax.eval_shape(lambda q, k, v: fj.attention(q, k, v, causal=True, align="bottom_right"), q, k, v)
    assert out.shape == (2, 100, 8, 32) and out.dtype == jnp.bfloat16
    grads = jax.eval_shape(jax.grad(lambda q, k, v: fj.attention(q, k, v).astype(jnp.float32).sum(), (0, 1, 2)),
                           q, k, v)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_vmap_adds_a_leading_axis():
    q = shaped(3, 2, 64, 4, 64)
    out = jax.eval_shape(jax.vmap(lambda q: fj.attention(q, q, q)), q)
    assert out.shape == q.shape


def test_bad_arguments_raise_fusedattn_errors_while_tracing():
    q = shaped(2, 64, 4, 60)
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        jax.eval_shape(lambda q: fj.attention(q, q, q), q)
    assert caught.value.field == "d_qk"
    with pytest.raises(fusedattn.InvalidArgumentError):
        fj.attention(jnp.zeros((2, 64, 4, 64), jnp.float32), jnp.zeros((2, 64, 4, 64), jnp.float32),
                     jnp.zeros((2, 64, 4, 64), jnp.float32))


def test_exported_for_cuda_calls_the_ffi_targets_with_the_spec():
    q = shaped(2, 128, 4, 64)
    loss = jax.jit(jax.grad(lambda q: fj.attention(q, q, q, causal=True).astype(jnp.float32).sum()))
    ours = [jax.export.DisabledSafetyCheck.custom_call(name)
            for name in ("fusedattn_forward", "fusedattn_backward")]
    exported = jax.export.export(loss, platforms=["cuda"], disabled_checks=ours)(q)
    text = exported.mlir_module()
    assert "fusedattn_forward" in text and "fusedattn_backward" in text
    assert "layout=bshd dtype=bf16 b=2 s_q=128 s_kv=128 h_q=4 h_kv=4 d_qk=64 d_v=64 window=-1,0" in text


def test_a_call_nobody_differentiates_writes_no_statistics():
    q = shaped(1, 64, 2, 64)
    ours = [jax.export.DisabledSafetyCheck.custom_call("fusedattn_forward")]
    text = jax.export.export(jax.jit(lambda q: fj.attention(q, q, q)), platforms=["cuda"],
                             disabled_checks=ours)(q).mlir_module()
    assert "stats=0" in text and "stats=1" not in text and "fusedattn_backward" not in text


def test_vmap_folds_the_mapped_axis_into_one_call_on_a_larger_batch():
    q = shaped(3, 2, 128, 4, 64)  # vmap over 3, batch 2 -> one call with b = 6
    ours = [jax.export.DisabledSafetyCheck.custom_call(name)
            for name in ("fusedattn_forward", "fusedattn_backward")]
    grad = jax.vmap(jax.grad(lambda q: fj.attention(q, q, q).astype(jnp.float32).sum()))
    text = jax.export.export(jax.jit(grad), platforms=["cuda"], disabled_checks=ours)(q).mlir_module()
    assert text.count("layout=bshd dtype=bf16 b=6 ") == 2 and "b=2 " not in text  # forward and backward
    twice = jax.vmap(jax.vmap(lambda q: fj.attention(q, q, q, layout="sbhd")))
    nested = jax.eval_shape(twice, shaped(2, 3, 64, 5, 4, 64))
    assert nested.shape == (2, 3, 64, 5, 4, 64)


@pytest.mark.parametrize("layout, axis", [("bshd", 0), ("sbhd", 1), ("bhsd", 0)])
def test_folding_keeps_each_mapped_element_in_its_own_batch_entries(layout, axis):
    from fusedattn.jax._batching import fold as _fold, unfold as _unfold
    x = jnp.arange(3 * 4 * 5 * 2 * 6).reshape(3, *((4, 5, 2, 6) if axis == 0 else (5, 4, 2, 6)))  # n=3, b=4
    folded = _fold(x, axis)
    for i in range(3):
        for b in range(4):
            entry = folded[i * 4 + b] if axis == 0 else folded[:, i * 4 + b]
            assert jnp.array_equal(entry, x[i, b] if axis == 0 else x[i, :, b])
    assert jnp.array_equal(_unfold(folded, 3, axis), x)


OURS = [jax.export.DisabledSafetyCheck.custom_call(name) for name in ("fusedattn_forward", "fusedattn_backward")]


def exported_text(fn, *args):
    return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=OURS)(*args).mlir_module()


def test_bias_sink_and_their_gradients_reach_the_spec_and_the_calls():
    q, k = shaped(2, 64, 4, 64), shaped(2, 80, 4, 64)
    bias, sink = shaped(1, 4, 64, 80, dtype=jnp.bfloat16), shaped(4, dtype=jnp.float32)

    def loss(q, k, bias, sink):
        return fj.attention(q, k, k, bias=bias, softmax="sink", sink=sink).astype(jnp.float32).sum()
    grads = jax.eval_shape(jax.grad(loss, (0, 1, 2, 3)), q, k, bias, sink)
    assert [g.shape for g in grads] == [q.shape, k.shape, bias.shape, sink.shape]
    text = exported_text(jax.grad(loss, (2, 3)), q, k, bias, sink)
    assert "bias=1hss" in text and "softmax=sink" in text and "bias_grad=1" in text


def test_dropout_draws_its_seed_from_the_key_and_replays_it():
    q = shaped(2, 64, 4, 64)
    key = jax.random.key(42)
    from fusedattn.jax._attention import _dropout_rng
    rng = _dropout_rng(key)
    assert rng.dtype == jnp.uint32 and rng.shape == (4,) and int(rng[1]) < 2 ** 31 and int(rng[2]) == 0
    assert jnp.array_equal(rng, _dropout_rng(key)) and not jnp.array_equal(rng, _dropout_rng(jax.random.key(43)))
    text = exported_text(lambda q: jax.grad(lambda q: fj.attention(q, q, q, dropout_rate=0.1, dropout_key=key)
                                            .astype(jnp.float32).sum())(q), q)
    assert "dropout=0.1" in text and text.count("tensor<4xui32>") >= 2  # the same seed into forward and backward


def test_packed_sequences_take_cumulative_offsets():
    q, cu = shaped(300, 8, 64), jax.ShapeDtypeStruct((5,), jnp.int32)  # 4 sequences, 300 tokens

    def attend(q, cu):
        return fj.attention(q, q, q, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=128,
                            max_seqlen_kv=128, causal=True)
    assert jax.eval_shape(attend, q, cu).shape == (300, 8, 64)
    text = exported_text(lambda q, cu: jax.grad(lambda q: attend(q, cu).astype(jnp.float32).sum())(q), q, cu)
    assert "layout=thd_thd_thd dtype=bf16 b=4 s_q=128 s_kv=128" in text and "sequences = 4" in text


def test_vmap_of_a_call_with_dropout_runs_per_element():
    q = shaped(3, 2, 64, 4, 64)
    key = jax.random.key(0)
    text = exported_text(jax.vmap(lambda q: fj.attention(q, q, q, dropout_rate=0.2, dropout_key=key)), q)
    assert "b=2 " in text and "b=6 " not in text  # each element its own call, with the key's own mask


def test_argument_errors_name_the_field():
    q = shaped(2, 64, 4, 64)
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        jax.eval_shape(lambda q: fj.attention(q, q, q, dropout_rate=0.1), q)
    assert caught.value.field == "dropout_key"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        jax.eval_shape(lambda q: fj.attention(q, q, q, softmax="sink"), q)
    assert caught.value.field == "sink"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        jax.eval_shape(lambda q: fj.attention(q, q, q, layout="thd"), shaped(64, 4, 64))
    assert caught.value.field == "cu_seqlens_q"


@pytest.mark.parametrize("layout, cache_layout, expected", [
    ("bshd", "bshd", "layout=bshd_paged_bshd dtype=bf16 b=4 s_q=1 s_kv=128 h_q=8 h_kv=2 d_qk=128 d_v=128 page_size=16"),
    ("sbhd", "sbhd", "layout=sbhd_paged_sbhd dtype=bf16 b=4 s_q=1 s_kv=128 h_q=8 h_kv=2 d_qk=128 d_v=128 page_size=16"),
])
def test_paged_caches_reach_the_spec(layout, cache_layout, expected):
    q = shaped(4, 1, 8, 128) if layout == "bshd" else shaped(1, 4, 8, 128)
    pool = shaped(64, 16, 2, 128) if cache_layout == "bshd" else shaped(16, 64, 2, 128)
    table, lengths = jax.ShapeDtypeStruct((4, 8), jnp.int32), jax.ShapeDtypeStruct((4,), jnp.int32)

    def decode(q, pool, table, lengths):
        return fj.paged_attention(q, pool, pool, table, table, lengths, layout=layout, cache_layout=cache_layout)
    assert jax.eval_shape(decode, q, pool, table, lengths).shape == q.shape
    text = exported_text(decode, q, pool, table, lengths)
    assert expected in text and "align=bottom_right" in text and "stats=0" in text


def test_runtime_lengths_make_a_padded_call():
    q, lengths = shaped(3, 100, 4, 64), jax.ShapeDtypeStruct((3,), jnp.int32)
    grads = jax.eval_shape(jax.grad(lambda q, n: fj.attention(q, q, q, seq_len_q=n, seq_len_kv=n).astype(
        jnp.float32).sum()), q, lengths)
    assert grads.shape == q.shape
    text = exported_text(lambda q, n: fj.attention(q, q, q, seq_len_q=n, seq_len_kv=n), q, lengths)
    assert "padding=1" in text
    with pytest.raises(fusedattn.InvalidArgumentError):
        jax.eval_shape(lambda q, n: fj.attention(q, q, q, seq_len_q=n), q, lengths)


@pytest.mark.parametrize("kind, shape", [("row", (2, 4, 64)), ("head", (4,))])
def test_max_logit_comes_with_o_and_is_not_differentiated(kind, shape):
    q = shaped(2, 64, 4, 64)
    o, max_logit = jax.eval_shape(lambda q: fj.attention(q, q, q, return_max_logit=kind), q)
    assert o.shape == q.shape and max_logit.shape == shape and max_logit.dtype == jnp.float32
    grad = jax.eval_shape(jax.grad(lambda q: fj.attention(q, q, q, return_max_logit=kind)[0].astype(
        jnp.float32).sum()), q)
    assert grad.shape == q.shape
    assert f"max_logit={kind}" in exported_text(lambda q: fj.attention(q, q, q, return_max_logit=kind), q)


# One wording for every adapter: a bad call raises, under jit tracing, exactly the message the
# core gives for the same call as a spec string (or a Config), since fusedattn.jax checks nothing
# the core checks.
SHAPE = "layout=bshd dtype=bf16 b=2 s_q=64 s_kv=64"


def core_error(check):
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        check()
    return caught.value


def traced_error(q_shape, kv_shape, bias_shape=None, **options):
    q, kv = shaped(*q_shape), shaped(*kv_shape)
    bias = None if bias_shape is None else shaped(*bias_shape)
    return core_error(lambda: jax.jit(lambda q, kv, bias: fj.attention(q, kv, kv, bias=bias, **options)).trace(
        q, kv, bias))


def same_error(ours, theirs):
    assert type(ours) is type(theirs) and str(ours) == str(theirs)
    assert (ours.field, ours.value, ours.requirement) == (theirs.field, theirs.value, theirs.requirement)


@pytest.mark.parametrize("q_shape, kv_shape, spec_text, field", [
    ((2, 64, 6, 64), (2, 64, 4, 64), f"{SHAPE} h_q=6 h_kv=4 d_qk=64 d_v=64", "h_q"),   # GQA: 4 does not divide 6
    ((2, 64, 4, 12), (2, 64, 4, 12), f"{SHAPE} h_q=4 h_kv=4 d_qk=12 d_v=12", "d_qk"),  # head dim 12
])
def test_a_bad_shape_raises_the_cores_message_for_its_spec_string(q_shape, kv_shape, spec_text, field):
    ours = traced_error(q_shape, kv_shape)
    same_error(ours, core_error(lambda: fusedattn._core.Spec.parse(spec_text).validate()))
    assert ours.field == field


def test_a_bad_option_raises_the_cores_message_for_its_config_and_spec_string():
    ours = traced_error((2, 64, 4, 64), (2, 64, 4, 64), align="diagonal")
    same_error(ours, core_error(lambda: fusedattn._core.Config("bshd", align="diagonal")))
    same_error(ours, core_error(lambda: fusedattn._core.Spec.parse(f"{SHAPE} h_q=4 h_kv=4 d_qk=64 d_v=64 "
                                                                   "align=diagonal")))
    assert str(ours) == "align = diagonal: one of top_left, bottom_right"


def test_a_bias_of_a_wrong_shape_raises_the_cores_message():
    q = ("bfloat16", (2, 64, 4, 64), (16384, 256, 64, 1))
    ours = traced_error((2, 64, 4, 64), (2, 64, 4, 64), bias_shape=(2, 4, 1, 64))  # no broadcast of rows alone
    theirs = core_error(lambda: fusedattn._core.Config("bshd").with_bias(
        ("bfloat16", (2, 4, 1, 64), (256, 64, 64, 1)), q, q))
    same_error(ours, theirs)
    assert ours.field == "bias.shape"


def test_what_the_core_cannot_see_is_checked_here_in_torchs_words():
    q = shaped(2, 64, 4, 64)
    ours = core_error(lambda: jax.eval_shape(lambda q: fj.attention(q, q, q, seq_len_q=jnp.ones(2, jnp.int32)), q))
    assert str(ours) == "seq_len_q = given: seq_len_q and seq_len_kv together"
    thd = shaped(64, 4, 64)
    ours = core_error(lambda: jax.eval_shape(lambda q: fj.attention(q, q, q, layout="thd"), thd))
    assert str(ours) == ("cu_seqlens_q = None: cu_seqlens_q, cu_seqlens_kv (int32 [n + 1]) and max_seqlen_q, "
                         "max_seqlen_kv with thd")


def test_the_call_is_the_core_config_plus_scale_and_bucket():
    from fusedattn import _config
    from fusedattn.jax._calls import BACKWARD, FORWARD, Call
    config = _config.config("bshd", causal=True, softmax="sink", dropout=0.1, max_logit="row").with_bias(
        ("bfloat16", (1, 4, 64, 80), (20480, 5120, 80, 1)), ("bfloat16", (2, 64, 4, 64), (16384, 256, 64, 1)),
        ("bfloat16", (2, 80, 4, 64), (20480, 256, 64, 1)))
    call, again = Call(config, 0.125), Call(_config.parse(str(config)), 0.125)  # hashable, by value
    assert call == again and hash(call) == hash(again) and call != Call(config, 0.25)
    assert call.inputs(FORWARD) == ("q", "k", "v", "bias", "sink", "rng")
    assert call.outputs(FORWARD) == ("o", "stats", "max_logit")
    assert call.inputs(BACKWARD) == ("q", "k", "v", "o", "stats", "d_o", "bias", "sink", "rng")
    assert call.outputs(BACKWARD) == ("d_q", "d_k", "d_v", "d_sink")  # bias_grad off
    ragged = Call(_config.config("thd", padding=True, stats=False), 0.125, (128, 128))
    assert ragged.inputs(FORWARD) == ("q", "k", "v", "cu_q", "cu_kv") and ragged.outputs(FORWARD) == ("o",)
    paged = Call(_config.config("bshd", "sbhd", padding=True, stats=False, kv_pages=8), 0.125)
    assert paged.inputs(FORWARD) == ("q", "k", "v", "seq_len_q", "seq_len_kv", "page_table_k", "page_table_v")


def test_packed_statistics_are_split_by_their_heads_axis():
    from fusedattn import _config
    from fusedattn.jax._calls import FORWARD, Call
    from fusedattn.jax._partition import sharding_rule
    call = Call(_config.config("thd", padding=True), 0.125, (128, 128))
    rule = sharding_rule(call, call.inputs(FORWARD), call.outputs(FORWARD), "same")
    assert rule == "s g d, t g d, t g e, cq, ck -> s g e, s g"  # stats are [t, h_q], like q's first two axes


# --- score_mod: jax.numpy functions traced into the core's expressions ------------------------------

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
