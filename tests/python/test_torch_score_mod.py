"""fusedattn.torch's score_mod without a GPU: FlexAttention's functions traced into the core's
expressions, what they cannot express named, gathered and learned terms as a dense bias with
gradients, tensor shapes checked, and compiled in one graph on meta tensors."""
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from meta_tensors import meta  # noqa: E402


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
        # index arithmetic: blocks by //, remainders by %, casts to integers toward zero
        (lambda s, b, h, q, kv: torch.where(q // 64 == kv // 64, s, -float("inf")),
         "select(eq(floor(div(q,$0)),floor(div(kv,$0))),score,-inf)", (64.0,)),
        (lambda s, b, h, q, kv: s + (kv - q) % 7, "add(score,sub(sub(kv,q),mul(floor(div(sub(kv,q),$0)),$0)))",
         (7.0,)),
        (lambda s, b, h, q, kv: s + (s / 2).to(torch.int64) + torch.div(kv, 3, rounding_mode="floor"),
         "add(add(score,trunc(div(score,$0))),floor(div(kv,$1)))",
         (2.0, 3.0)),
    ]
    for fn, text, scalars in cases:
        entry = traced(fn)
        assert (entry.traced.text, entry.traced.scalars) == (text, scalars)
        core_text = str(fa._config.config(score_mod=entry.traced.text))  # the core parses it back
        assert text in core_text


def test_an_identity_score_mod_is_no_modifier():
    # FlexAttention's users pass `lambda score, b, h, q, kv: score` for "no modifier": it runs as plain
    # attention, with no score graph (whatever the layout: packed document masks take it too).
    from fusedattn.torch._score_mod import prepare
    q = torch.empty(2, 4, 8, 16)
    assert prepare(lambda s, b, h, q_idx, kv_idx: s, q, q, "bhsd") == ("", {}, None)
    assert prepare(lambda s, b, h, q_idx, kv_idx: s, q.view(16, 4, 16), q.view(16, 4, 16), "thd") == ("", {}, None)


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
                      (lambda s, b, h, qi, kv: torch.round(s), "round()")]:
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
    # Gradients against float64 sums, to float32's rounding of sums of a few hundred products (the
    # bias by distance sums each diagonal first, in another order than the gather's).
    weights = torch.randn(bias.shape)
    (bias * weights).sum().backward()
    got = (table.grad.clone(), slopes.grad.clone())
    table.grad = slopes.grad = None
    table64, slopes64 = (x.detach().double().requires_grad_() for x in (table, slopes))
    distance = grids[3] - grids[2]
    want64 = table64[grids[1], distance.clamp(-8, 8) + 8] - slopes64[grids[1]] * distance.abs()
    (want64 * weights.double()).sum().backward()
    for ours, truth in zip(got, (table64.grad, slopes64.grad)):
        assert torch.allclose(ours.double(), truth, rtol=0, atol=1e-6 * truth.abs().max())
    slopes.requires_grad_(False)  # no longer learned: its term goes back into the modifier (traced anew)
    traced = _torch_score_mod.traced(fn).traced
    assert "t0[h]" in traced.text and traced.bias.text.startswith("G0(")


def t5_bucket(relative, num_buckets=32, max_distance=128):
    """T5's bidirectional relative-position bucket, as transformers and FlexAttention's tests write it."""
    num_buckets //= 2
    buckets = (relative > 0).to(torch.long) * num_buckets
    relative = torch.abs(relative)
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    large = max_exact + (torch.log(relative.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative, large)


def test_t5_bucketed_bias_traces_into_a_dense_bias_equal_to_the_function():
    # Casts, floor division and a clamp by torch.min: the table's term runs as the call's bias,
    # evaluated on index grids, equal to the function there (and differentiable into the table).
    from fusedattn.torch import _score_mod as _torch_score_mod
    table = torch.randn(32, 4, requires_grad=True)

    def fn(s, b, h, qi, kv):
        return s + table[t5_bucket(kv - qi), h]
    traced = _torch_score_mod.traced(fn).traced
    assert traced.text == "" and traced.bias.text.startswith("G0(")  # the score itself is left alone
    q, k = torch.zeros(1, 150, 4, 64), torch.zeros(1, 200, 4, 64)
    bias = _torch_score_mod.dense_bias(traced.bias, q, k, "bshd")
    qi, kv = torch.arange(150).view(150, 1), torch.arange(200).view(1, 200)
    want = table[t5_bucket(kv - qi), :].permute(2, 0, 1).unsqueeze(0)  # [1, h, s_q, s_kv]
    assert torch.equal(bias, want)
    # The table's gradient sums about 2,000 products a bucket: against float64 sums, to float32's
    # rounding of such sums (fusedattn sums by distance first, in another order than the gather's).
    weights = torch.randn(bias.shape)
    (bias * weights).sum().backward()
    table64 = table.detach().double().requires_grad_()
    (table64[t5_bucket(kv - qi), :].permute(2, 0, 1).unsqueeze(0) * weights.double()).sum().backward()
    assert torch.allclose(table.grad.double(), table64.grad, rtol=0, atol=1e-6 * table64.grad.abs().max())


def test_a_bias_by_distance_is_evaluated_once_per_distance():
    # T5's bucket and a clamped relative position read q and kv only through kv - q: their bias is
    # evaluated over the s_q + s_kv - 1 distances and laid out as a Toeplitz matrix (_distance_bias.py),
    # equal to the dense gather; a term reading q or kv alone keeps the dense grid.
    from fusedattn._score_mod_bias import by_distance
    from fusedattn.torch import _distance_bias, _score_mod as _torch_score_mod
    table = torch.randn(4, 33)
    for fn, distance in ((lambda s, b, h, qi, kv: s + table[h, (kv - qi).clamp(-16, 16) + 16], True),
                         (lambda s, b, h, qi, kv: s + table[h, (qi - kv).abs().clamp(max=32)], True),
                         (lambda s, b, h, qi, kv: s + table[h, (kv - qi).clamp(-16, 16) + 16] * (qi > 3), False),
                         (lambda s, b, h, qi, kv: s + table[h, kv.clamp(max=32)], False)):
        part = _torch_score_mod.traced(fn).traced.bias
        assert by_distance(part.text) == distance, part.text
        q, k = torch.zeros(2, 70, 4, 64, dtype=torch.bfloat16), torch.zeros(2, 90, 4, 64, dtype=torch.bfloat16)
        assert _distance_bias.applies(part.text, (2, 4, 70, 90)) == distance
        bias = _torch_score_mod.dense_bias(part, q, k, "bshd")
        grids = [torch.arange(n).view(*([1] * a), n, *([1] * (3 - a))) for a, n in enumerate((2, 4, 70, 90))]
        want = fn(torch.zeros(()), *grids).to(torch.bfloat16)
        assert bias.shape == (1, 4, 70, 90) and bias.is_contiguous() and torch.equal(bias, want.expand(bias.shape))


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
