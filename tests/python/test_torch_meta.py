"""fusedattn.torch without a GPU: the operators' fake (meta) implementations give every output's
shape, strides and dtype, autograd wires the backward, and torch.compile traces a transformer
block with fusedattn inside in one graph (fullgraph=True), on meta tensors; the arguments refused.
The spec the tensors translate to: test_torch_spec.py; score_mod: test_torch_score_mod.py; the C++
fast path's errors and the fallback: test_torch_paths.py."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from meta_tensors import meta  # noqa: E402
from torch_blocks import Block  # noqa: E402


@pytest.mark.parametrize("layout, q_shape, kv_shape", [
    ("bshd", (2, 100, 8, 64), (2, 150, 2, 64)),
    ("sbhd", (100, 2, 8, 64), (150, 2, 2, 64)),
    ("bhsd", (2, 8, 100, 64), (2, 2, 150, 64)),
])
def test_outputs_follow_q_layout_and_gradients_their_inputs(layout, q_shape, kv_shape):
    q, k, v = meta(*q_shape), meta(*kv_shape), meta(*kv_shape[:-1], 32)
    o, stats = fa.attention(q, k, v, layout=layout, causal=True, return_stats=True)
    assert o.shape == q_shape[:-1] + (32,) and o.dtype == q.dtype
    assert stats.dtype == torch.float32 and stats.numel() == 2 * 8 * 100
    o.sum().backward()
    for x in (q, k, v):
        assert x.grad.shape == x.shape and x.grad.stride() == x.stride()


def test_packed_qkv_views_get_packed_strided_gradients():
    qkv = meta(2, 64, 3, 4, 64)
    q, k, v = qkv.unbind(2)
    o = fa.attention(q, k, v, layout="bshd")
    o.sum().backward()
    assert qkv.grad.shape == qkv.shape


def test_ragged_statistics_are_by_token():
    q, k, v = meta(1000, 8, 128), meta(1000, 2, 128), meta(1000, 2, 128)
    cu = torch.empty(5, device="meta", dtype=torch.int32)
    o, stats = fa.attention(q, k, v, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=512,
                            max_seqlen_kv=512, causal=True, return_stats=True)
    assert o.shape == (1000, 8, 128) and stats.shape == (1000, 8)


def test_bias_and_sink_get_gradients():
    q, k, v = meta(2, 64, 4, 64), meta(2, 64, 4, 64), meta(2, 64, 4, 64)
    bias = meta(1, 4, 64, 64)
    sink = meta(4, dtype=torch.float32)
    o = fa.attention(q, k, v, bias=bias, softmax="sink", sink=sink)
    o.sum().backward()
    assert bias.grad.shape == bias.shape and sink.grad.shape == sink.shape


def test_operators_are_registered_with_torch_library():
    assert hasattr(torch.ops.fusedattn, "forward") and hasattr(torch.ops.fusedattn, "backward")


def test_bad_arguments_raise_fusedattn_errors():
    from fusedattn import InvalidArgumentError
    q = meta(2, 64, 4, 64)
    with pytest.raises(InvalidArgumentError) as caught:
        fa.attention(q, q, q, layout="bsdh")
    assert caught.value.field == "layout"
    with pytest.raises(InvalidArgumentError):
        fa.attention(q, q, q, layout="thd")  # no offsets


def test_compiles_in_one_graph_with_fullgraph():
    block = Block().to(device="meta", dtype=torch.bfloat16)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    x = torch.empty(2, 64, 128, device="meta", dtype=torch.bfloat16, requires_grad=True)
    y = compiled(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape


def test_bias_shapes_are_checked_against_the_problem():
    from fusedattn import InvalidArgumentError
    q = meta(2, 64, 4, 64)
    with pytest.raises(InvalidArgumentError) as caught:
        fa.attention(q, q, q, bias=meta(2, 4, 64, 63))
    assert caught.value.field == "bias.shape"
    with pytest.raises(InvalidArgumentError):
        fa.attention(q, q, q, bias=meta(2, 4, 1, 64))  # [b, h, 1, s_kv] is not one of the five kinds
    for shape in ((2, 4, 64, 64), (2, 1, 64, 64), (1, 4, 64, 64), (1, 1, 64, 64), (1, 1, 1, 64)):
        assert fa.attention(q, q, q, bias=meta(*shape)).shape == q.shape


def test_inputs_must_agree_and_live_on_a_gpu():
    from fusedattn import InvalidArgumentError
    q = meta(2, 64, 4, 64)
    with pytest.raises(InvalidArgumentError) as caught:
        fa.attention(q, meta(2, 64, 4, 64, dtype=torch.float16), q)
    assert caught.value.field == "k.dtype"
    cpu = torch.zeros(2, 64, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError) as caught:
        fa.attention(cpu, cpu, cpu)
    assert caught.value.field == "q.device"


def test_dropout_traces_and_differentiates():
    q = meta(2, 64, 4, 64)
    o = fa.attention(q, q, q, dropout_p=0.1, causal=True)
    o.sum().backward()
    assert o.shape == q.shape and q.grad.shape == q.shape


@pytest.mark.parametrize("layout, cache_layout", [("bshd", "bshd"), ("sbhd", "sbhd"), ("bshd", "sbhd")])
def test_paged_attention_output_follows_q(layout, cache_layout):
    q = meta(8, 1, 32, 128, grad=False) if layout == "bshd" else meta(1, 8, 32, 128, grad=False)
    pool = meta(300, 64, 8, 128, grad=False) if cache_layout == "bshd" else meta(64, 300, 8, 128, grad=False)
    table = torch.empty(8, 32, device="meta", dtype=torch.int32)
    lengths = torch.empty(8, device="meta", dtype=torch.int32)
    o = fa.paged_attention(q, pool, pool, table, table, lengths, layout=layout, cache_layout=cache_layout)
    assert o.shape == q.shape


def test_padding_lengths_come_in_pairs():
    from fusedattn import InvalidArgumentError
    q = meta(2, 64, 4, 64)
    lengths = torch.empty(2, device="meta", dtype=torch.int32)
    assert fa.attention(q, q, q, seq_len_q=lengths, seq_len_kv=lengths).shape == q.shape
    with pytest.raises(InvalidArgumentError):
        fa.attention(q, q, q, seq_len_q=lengths)
    with pytest.raises(InvalidArgumentError):
        fa.attention(q, q, q, seq_len_kv=lengths)


def test_max_logit_per_row_and_per_head():
    q = meta(2, 64, 4, 64, grad=False)
    o, rows = fa.attention(q, q, q, return_max_logit="row")
    assert rows.shape == (2, 4, 64) and rows.dtype == torch.float32
    o, stats, heads = fa.attention(q, q, q, return_stats=True, return_max_logit="head")
    assert heads.shape == (4,) and stats.shape == (2, 4, 64)
