"""fusedattn.torch without a GPU: the operators' fake (meta) implementations give every output's
shape, strides and dtype, autograd wires the backward, and torch.compile traces a transformer
block with fusedattn inside in one graph (fullgraph=True), on meta tensors."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn.torch import _tensors  # noqa: E402


def meta(*shape, dtype=torch.bfloat16, grad=True):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


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


class Block(torch.nn.Module):
    def __init__(self, dim=128, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        b, s, dim = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, dim // self.heads).unbind(2)
        return x + self.out(fa.attention(q, k, v, layout="bshd", causal=True).reshape(b, s, dim))


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


# What the adapter hands the core: the spec its tensors translate to (no GPU needed to build it).
def spec_of(q, k, v, layout, kv_layout="", sequences=0, max_q=0, max_kv=0, **options):
    from fusedattn import _config
    config = _config.config(layout, kv_layout, stats=False, **options)
    return str(config.spec(_tensors.view(q), _tensors.view(k), _tensors.view(v), sequences, max_q, max_kv))


@pytest.mark.parametrize("layout, q_shape, kv_shape", [
    ("bshd", (2, 100, 8, 64), (2, 150, 2, 64)),
    ("sbhd", (100, 2, 8, 64), (150, 2, 2, 64)),
    ("bhsd", (2, 8, 100, 64), (2, 2, 150, 64)),
])
def test_tensors_translate_to_the_named_layout(layout, q_shape, kv_shape):
    q, k, v = meta(*q_shape, grad=False), meta(*kv_shape, grad=False), meta(*kv_shape, grad=False)
    assert spec_of(q, k, v, layout) == (f"layout={layout} dtype=bf16 b=2 s_q=100 s_kv=150 h_q=8 h_kv=2 d_qk=64 "
                                        "d_v=64 stats=0")


def test_packed_views_translate_to_packed_layouts():
    qkv = meta(2, 64, 3, 4, 32, grad=False)
    assert spec_of(*qkv.unbind(2), "bshd").startswith("layout=bs3hd dtype=bf16 b=2 s_q=64 s_kv=64 h_q=4 h_kv=4")
    q, kv = meta(2, 64, 4, 32, grad=False), meta(2, 80, 2, 2, 32, grad=False)
    assert spec_of(q, *kv.unbind(2), "bshd").startswith("layout=bshd_bs2hd ")


def test_ragged_and_paged_translate_to_their_layouts():
    q, kv = meta(1000, 8, 128, grad=False), meta(1000, 2, 128, grad=False)
    text = spec_of(q, kv, kv, "thd", sequences=5, max_q=333, max_kv=517, causal=True, padding=True)
    assert text == "layout=thd_thd_thd dtype=bf16 b=5 s_q=333 s_kv=517 h_q=8 h_kv=2 d_qk=128 d_v=128 window=-1,0 stats=0"
    qd, pool = meta(4, 1, 8, 128, grad=False), meta(64, 300, 2, 128, grad=False)  # sbhd pages of 64 tokens
    table = torch.empty(4, 16, device="meta", dtype=torch.int32)
    text = spec_of(qd, pool, pool, "bshd", "sbhd", sequences=table.shape[0], causal=True, align="bottom_right",
                   padding=True, kv_pages=table.shape[1])
    assert text == ("layout=bshd_paged_sbhd dtype=bf16 b=4 s_q=1 s_kv=1024 h_q=8 h_kv=2 d_qk=128 d_v=128 "
                    "page_size=64 pages=300 window=-1,0 align=bottom_right stats=0")


def test_the_cpp_fast_path_maps_errors_like_the_rest():
    fast = pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    import fusedattn
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
    config_id = fa._plain_config_id("bshd", False, (-1, -1), "top_left", False, "vanilla", False)
    assert fa._plain_config_id("bshd", False, (-1, -1), "top_left", False, "vanilla", False) == config_id >= 0
    assert fast.forward(q, q, q, config_id, 0.125) is NotImplemented  # not on a GPU: the general path says why
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fa.attention(q, q, q)
    assert caught.value.field == "q.device" and caught.value.requirement == "a CUDA device"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fast.forward(q, "k", q, config_id, 0.125)
    assert caught.value.field == "k" and caught.value.requirement == "a torch.Tensor"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fast.forward(q, q, q, 1 << 20, 0.125)
    assert caught.value.field == "config_id"


@pytest.mark.parametrize("left, right, align, with_bias", [
    (-1, 0, "top_left", False), (-1, 0, "top_left", True), (-1, 0, "bottom_right", False),
    (16, 0, "bottom_right", True), (8, 4, "top_left", False), (-1, -1, "top_left", True)])
def test_the_fallback_applies_the_cores_window_rule(left, right, align, with_bias):
    """On the CPU: PyTorch's attention as the fallback runs it, against scores masked by the rule
    the core documents (diagonal p; keys p - left < j <= p + right visible)."""
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 40, 4, 16), torch.randn(2, 56, 2, 16), torch.randn(2, 56, 2, 16)
    bias = torch.randn(2, 4, 40, 56) if with_bias else None
    out = fa._fallback.run(q, k, v, layout="bshd", window=(left, right), align=align, scale=0.25, bias=bias,
                           dropout_p=0.0)
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    kb, vb = kb.repeat_interleave(2, 1), vb.repeat_interleave(2, 1)
    scores = qb @ kb.transpose(-1, -2) * 0.25 + (bias if with_bias else 0)
    shift = 56 - 40 if align == "bottom_right" else 0
    for i in range(40):
        for j in range(56):
            p = i + shift
            if (left >= 0 and j <= p - left) or (right >= 0 and j > p + right):
                scores[:, :, i, j] = float("-inf")
    expected = (torch.softmax(scores, -1) @ vb).transpose(1, 2)
    assert torch.allclose(out, expected, atol=1e-5)


# --- score_mod: FlexAttention's functions traced into the core's expressions ----------------------

SLOPES = torch.rand(4)


def test_score_mod_functions_trace_into_expressions():
    from fusedattn.torch._score_mod import traced
    cases = [
        (lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0), "mul($0,tanh(div(score,$0)))", (30.0,)),
        (lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q), "add(score,mul(t0[h],sub(kv,q)))", ()),
        (lambda s, b, h, q, kv: torch.where((kv <= q) | (kv < 16), s, -float("inf")),
         "select(or(le(kv,q),lt(kv,$0)),score,-inf)", (16.0,)),
        (lambda s, b, h, q, kv: s.tanh().clamp(max=0.5) * 2, "mul(min(tanh(score),$0),$1)", (0.5, 2.0)),
        (lambda s, b, h, q, kv: torch.sigmoid(s) - 1 + abs(s) ** 2.5 + s ** 2,
         "add(add(sub(sigmoid(score),1),pow(abs(score),$0)),pow(score,2))", (2.5,)),
    ]
    for fn, text, scalars in cases:
        entry = traced(fn)
        assert (entry.traced.text, entry.traced.scalars) == (text, scalars)
        core_text = str(fa._config.config(score_mod=entry.traced.text))  # the core parses it back
        assert text in core_text


def test_score_mod_closure_numbers_retrace_and_tensors_are_kept():
    from fusedattn.torch._score_mod import traced

    def capped(cap):
        return lambda s, b, h, q, kv: cap * torch.tanh(s / cap)

    fn = capped(5.0)
    assert traced(fn) is traced(fn)  # traced once
    assert traced(fn).traced.scalars == (5.0,)
    assert traced(lambda s, b, h, q, kv: s + SLOPES[h]).traced.tensors[0] is SLOPES


def test_score_mod_operations_it_cannot_express_are_named():
    from fusedattn import NotSupportedError
    q = meta(2, 64, 4, 64)
    for fn, words in [(lambda s, b, h, qi, kv: s * SLOPES[kv - qi], "gathers from a tensor"),
                      (lambda s, b, h, qi, kv: torch.erf(s), "erf()"),
                      (lambda s, b, h, qi, kv: s if s > 0 else -s, "Python control flow"),
                      (lambda s, b, h, qi, kv: s // 2, "floor division")]:
        with pytest.raises(NotSupportedError) as caught:
            fa.attention(q, q, q, score_mod=fn)
        assert words in str(caught.value)


def test_gathered_and_learned_terms_run_as_a_dense_bias_with_gradients():
    # A relative-position table by clamped distance and learnable ALiBi slopes: the terms come apart
    # as the call's bias, evaluated with torch operations, equal to the function on index grids and
    # differentiable into the tensors (on the CPU: the bias alone, without attention).
    from fusedattn.torch import _score_mod as _torch_score_mod
    table, slopes = torch.randn(4, 17, requires_grad=True), torch.rand(4, requires_grad=True)

    def fn(s, b, h, qi, kv):
        return 2.0 * torch.tanh(s / 2.0) + table[h, (kv - qi).clamp(-8, 8) + 8] - slopes[h] * (qi - kv).abs()
    traced = _torch_score_mod.traced(fn).traced
    # beside a bias the modifier's numbers are written into it (cuDNN builds no backward otherwise)
    assert traced.text == "mul(2.0,tanh(div(score,2.0)))" and traced.scalars == ()
    q, k = torch.zeros(2, 20, 4, 64), torch.zeros(2, 24, 4, 64)
    bias = _torch_score_mod.dense_bias(traced.bias, q, k, "bshd")
    assert bias.shape == (1, 4, 20, 24) and bias.dtype == q.dtype
    grids = [torch.arange(n).view(*([1] * a), n, *([1] * (3 - a))) for a, n in enumerate((2, 4, 20, 24))]
    want = fn(torch.zeros(()), *grids) - 2.0 * torch.tanh(torch.zeros(()))
    assert torch.equal(bias, want.expand(1, 4, 20, 24))
    weights = torch.randn(bias.shape)
    (bias * weights).sum().backward()
    got = (table.grad.clone(), slopes.grad.clone())
    table.grad = slopes.grad = None
    (want * weights).sum().backward()
    assert torch.allclose(got[0], table.grad) and torch.allclose(got[1], slopes.grad)
    slopes.requires_grad_(False)  # no longer learned: its term goes back into the modifier (traced anew)
    traced = _torch_score_mod.traced(fn).traced
    assert "t0[h]" in traced.text and traced.bias.text.startswith("G0(")


def test_score_mod_tensor_shapes_are_checked():
    from fusedattn import InvalidArgumentError
    q = meta(2, 64, 4, 64)
    wrong = torch.rand(3)
    with pytest.raises(InvalidArgumentError) as caught:
        fa.attention(q, q, q, score_mod=lambda s, b, h, qi, kv: s + wrong[h])
    assert caught.value.field == "score_mod.t0.shape"


@pytest.mark.parametrize("where", ["global", "closure"])
def test_score_mod_compiles_in_one_graph(where):
    slopes = torch.rand(4, device="meta")
    fn = (lambda s, b, h, qi, kv: s + SLOPES_META[h] * (kv - qi)) if where == "global" else \
        (lambda s, b, h, qi, kv: 2.0 * torch.tanh(s / 2.0) + slopes[h])

    def step(q):
        return fa.attention(q, q, q, causal=True, score_mod=fn)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    q = meta(2, 64, 4, 64)
    y = compiled(q)
    y.sum().backward()
    assert y.shape == q.shape and q.grad.shape == q.shape


SLOPES_META = torch.rand(4, device="meta")
