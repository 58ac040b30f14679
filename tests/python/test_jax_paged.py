"""fusedattn.jax.paged_attention without a GPU: a decode step's program, exported for CUDA, is the one
custom call on the arrays as the caller holds them (no length array filled for q: the handler's
query_lengths attribute says it has none), and seq_len_q where given. The tables' and lengths'
errors: test_same_messages.py; numerics on a GPU: test_jax_gpu.py."""
import re

import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402

from jax_shapes import exported_text, shaped  # noqa: E402

B, PAGES = 2, 128


def arrays(s_q=1):
    q, pool = shaped(B, s_q, 32, 128), shaped(B * PAGES, 64, 8, 128)
    return q, pool, jax.ShapeDtypeStruct((B, PAGES), jnp.int32), jax.ShapeDtypeStruct((B,), jnp.int32)


def operations(text):
    """The program's operations in order, by name (stablehlo.custom_call, ...)."""
    return re.findall(r"^\s*%[\w:#]+ = ([a-z_]+\.[a-z_]+)", text, re.MULTILINE)


def custom_call(text):
    """(operand types, backend_config) of the program's one custom call."""
    line = next(line for line in text.splitlines() if "stablehlo.custom_call" in line)
    return re.search(r": \(([^)]*)\) ->", line).group(1).split(", "), re.search(r"backend_config = \{([^}]*)\}",
                                                                              line).group(1)


def test_a_decode_step_is_one_custom_call_without_a_length_array_for_q():
    q, pool, table, lengths = arrays()
    text = exported_text(lambda q, p, t, n: fj.paged_attention(q, p, p, t, t, n), q, pool, table, lengths)
    assert operations(text) == ["stablehlo.custom_call"]
    operands, config = custom_call(text)
    assert operands == ["tensor<2x1x32x128xbf16>", "tensor<256x64x8x128xbf16>", "tensor<256x64x8x128xbf16>",
                        "tensor<2xi32>", "tensor<2x128xi32>", "tensor<2x128xi32>"]  # q, k, v, seq_len_kv, tables
    assert "query_lengths = false" in config and "layout=bshd_paged_bshd" in config


def test_seq_len_q_where_given_is_the_calls_operand():
    q, pool, table, lengths = arrays(s_q=4)
    text = exported_text(lambda q, p, t, n, m: fj.paged_attention(q, p, p, t, t, n, seq_len_q=m), q, pool, table,
                         lengths, lengths)
    assert operations(text) == ["stablehlo.custom_call"]
    operands, config = custom_call(text)
    assert operands[3:5] == ["tensor<2xi32>", "tensor<2xi32>"] and len(operands) == 7  # seq_len_q, seq_len_kv
    assert "query_lengths = true" in config


def test_attention_calls_keep_both_lengths():
    q, lengths = shaped(3, 100, 4, 64), jax.ShapeDtypeStruct((3,), jnp.int32)
    operands, config = custom_call(exported_text(lambda q, n: fj.attention(q, q, q, seq_len_q=n, seq_len_kv=n), q,
                                                 lengths))
    assert operands[3:] == ["tensor<3xi32>", "tensor<3xi32>"] and "query_lengths = true" in config


@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
def test_an_fp8_cache_decode_step_is_one_custom_call_with_its_descales_last(per_head):
    """E4M3 pools beside a bf16 q: the spec names them, and the call takes descale_k and descale_v
    after the tables, as scalars (one element each, given as [1]) or [h_kv]."""
    q, _, table, lengths = arrays()
    pool = jax.ShapeDtypeStruct((B * PAGES, 64, 8, 128), jnp.float8_e4m3fn)
    descale = jax.ShapeDtypeStruct((8,) if per_head else (1,), jnp.float32)
    text = exported_text(lambda q, p, t, n, dk, dv: fj.paged_attention(q, p, p, t, t, n, descale_k=dk, descale_v=dv),
                         q, pool, table, lengths, descale, descale)
    assert operations(text).count("stablehlo.custom_call") == 1
    operands, config = custom_call(text)
    scale_type = "tensor<8xf32>" if per_head else "tensor<f32>"
    assert operands[1] == "tensor<256x64x8x128xf8E4M3FN>" and operands[6:] == [scale_type, scale_type]
    assert "k=e4m3" in config and ("fp8_scaling=head" in config) == per_head
