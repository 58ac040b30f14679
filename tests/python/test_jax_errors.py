"""fusedattn.jax's errors at trace time, without a GPU: bad arguments name the field, and a bad call
raises exactly the core's message for the same call as a spec string (or a Config)."""
import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402

import fusedattn  # noqa: E402
from jax_shapes import shaped  # noqa: E402


def test_bad_arguments_raise_fusedattn_errors_while_tracing():
    q = shaped(2, 64, 4, 60)
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        jax.eval_shape(lambda q: fj.attention(q, q, q), q)
    assert caught.value.field == "d_qk"
    with pytest.raises(fusedattn.InvalidArgumentError):
        fj.attention(jnp.zeros((2, 64, 4, 64), jnp.float32), jnp.zeros((2, 64, 4, 64), jnp.float32),
                     jnp.zeros((2, 64, 4, 64), jnp.float32))


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
