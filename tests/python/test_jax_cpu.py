"""fusedattn.jax without a GPU: shapes through jax.eval_shape (forward, grad, vmap), and the program
exported for CUDA: the FFI custom calls with the spec attribute (bias, sink, dropout, packed and
paged batches, runtime lengths, max logit), vmap's folding into the batch, the calls' operands.
Errors at trace time: test_jax_errors.py; score_mod: test_jax_score_mod.py."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402

import fusedattn  # noqa: E402
from jax_shapes import exported_text, shaped  # noqa: E402


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
