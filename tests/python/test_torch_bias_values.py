"""fusedattn.torch's dense bias without a GPU: index values (T5's bucket) kept between eager calls per
structure, numbers and size, bounded by bytes; a gather that is the whole bias read in the bias's
dtype, equal to gathering and converting; a table that needs a gradient still gets it; a bias by
distance laid out as its Toeplitz matrix, eager and compiled."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn.torch import _index_values, _score_mod  # noqa: E402
from test_torch_score_mod import t5_bucket  # noqa: E402


@pytest.fixture(autouse=True)
def fresh():
    _index_values.clear()
    yield
    _index_values.clear()


def grids(s_q, s_kv):
    return torch.arange(s_q).view(s_q, 1), torch.arange(s_kv).view(1, s_kv)


def t5_bias(table, s_q, s_kv, dtype):
    fn = lambda s, b, h, qi, kv: s + table[t5_bucket(kv - qi), h]  # noqa: E731
    part = _score_mod.traced(fn).traced.bias
    q, k = torch.zeros(1, s_q, 4, 64, dtype=dtype), torch.zeros(1, s_kv, 4, 64, dtype=dtype)
    return _score_mod.dense_bias(part, q, k, "bshd")


def test_index_values_are_kept_between_calls_and_the_bias_follows_the_table():
    table = torch.randn(32, 4)
    qi, kv = grids(150, 200)
    for _ in range(2):
        want = table[t5_bucket(kv - qi), :].permute(2, 0, 1).unsqueeze(0)
        assert torch.equal(t5_bias(table, 150, 200, torch.float32), want)
        assert len(_index_values._kept) == 1  # one structure, one size: its bucket
        table.mul_(-2.0)  # written in place, as an optimizer does: read again at the next call
    t5_bias(table, 150, 201, torch.float32)
    assert len(_index_values._kept) == 2  # another size, another entry


def test_the_numbers_of_a_function_key_its_kept_values():
    table = torch.randn(64, 4)
    for limit in (5, 9, 5):
        def fn(s, b, h, qi, kv, limit=limit):
            return s + table[torch.clamp(kv - qi, -limit, limit) + limit, h]
        part = _score_mod.traced(fn).traced.bias
        q, k = torch.zeros(1, 30, 4, 64), torch.zeros(1, 40, 4, 64)
        qi, kv = grids(30, 40)
        want = table[torch.clamp(kv - qi, -limit, limit) + limit, :].permute(2, 0, 1).unsqueeze(0)
        assert torch.equal(_score_mod.dense_bias(part, q, k, "bshd"), want), limit


def test_a_whole_bias_gather_in_the_bias_dtype_equals_gathering_then_converting():
    table = torch.randn(32, 4)
    qi, kv = grids(70, 90)
    want = table[t5_bucket(kv - qi), :].permute(2, 0, 1).unsqueeze(0).to(torch.bfloat16)
    got = t5_bias(table, 70, 90, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_a_table_that_needs_a_gradient_is_gathered_as_it_is():
    table = torch.randn(32, 4, requires_grad=True)
    qi, kv = grids(50, 60)
    got = t5_bias(table, 50, 60, torch.bfloat16)
    weights = torch.randn(got.shape)
    (got.float() * weights).sum().backward()
    ours = table.grad.clone()
    table.grad = None
    want = table[t5_bucket(kv - qi), :].permute(2, 0, 1).unsqueeze(0).to(torch.bfloat16)
    assert torch.equal(got, want)
    # The bias's gradient arrives in its bfloat16; summed in float32 (by distance, then into the
    # buckets): to float32's rounding of float64's sums of the same bfloat16 gradient.
    table64 = table.detach().double().requires_grad_()
    arriving = weights.to(torch.bfloat16).double()
    (table64[t5_bucket(kv - qi), :].permute(2, 0, 1).unsqueeze(0) * arriving).sum().backward()
    assert torch.allclose(ours.double(), table64.grad, rtol=0, atol=1e-6 * table64.grad.abs().max())


def test_kept_values_are_bounded_by_bytes(monkeypatch):
    # A bucket that also reads the query's block (not a function of kv - q alone): its index values
    # span the whole [s_q, s_kv] grid and are kept per size.
    table = torch.randn(48, 4)
    fn = lambda s, b, h, qi, kv: s + table[t5_bucket(kv - qi) + qi // 32, h]  # noqa: E731
    part = _score_mod.traced(fn).traced.bias

    def bias(s_q, s_kv):
        return _score_mod.dense_bias(part, torch.zeros(1, s_q, 4, 64), torch.zeros(1, s_kv, 4, 64), "bshd")
    bias(50, 124)
    (one,) = _index_values._kept.values()
    size = _index_values._size(one)  # the bytes of one size's values, [50, 124] of them
    _index_values.clear()
    monkeypatch.setattr(_index_values, "_BYTES", 4 * size)
    for s_kv in range(120, 125):  # each within a quarter of the bound: kept, the oldest going first
        bias(50, s_kv)
    assert [key[2][3] for key in _index_values._kept] == [121, 122, 123, 124]
    bias(100, 120)  # over a quarter of the bound: not kept
    assert [key[2][3] for key in _index_values._kept] == [121, 122, 123, 124]


def test_a_bias_by_distance_keeps_values_of_its_distances_only():
    table = torch.randn(32, 4)
    t5_bias(table, 150, 200, torch.float32)
    (key,) = _index_values._kept
    assert key[2] == (1, 4, 1, 349)  # one query, the 150 + 200 - 1 distances


def test_nothing_is_kept_from_meta_tensors():
    table = torch.randn(32, 4, device="meta")
    fn = lambda s, b, h, qi, kv: s + table[t5_bucket(kv - qi), h]  # noqa: E731
    part = _score_mod.traced(fn).traced.bias
    q = torch.zeros(1, 20, 4, 64, device="meta")
    assert _score_mod.dense_bias(part, q, q, "bshd").shape == (1, 4, 20, 20)
    assert not _index_values._kept


def test_the_toeplitz_layout_compiles_forward_and_backward():
    from fusedattn.torch._distance_bias import toeplitz
    values = torch.randn(1, 4, 1, 9, requires_grad=True)
    step = torch.compile(lambda v: toeplitz(v, 4, 6, torch.bfloat16), fullgraph=True, backend="aot_eager")
    out = step(values)
    assert torch.equal(out, toeplitz(values, 4, 6, torch.bfloat16))
    weights = torch.randn(out.shape)
    (compiled,) = torch.autograd.grad((out.float() * weights).sum(), values)
    (eager,) = torch.autograd.grad((toeplitz(values, 4, 6, torch.bfloat16).float() * weights).sum(), values)
    assert torch.equal(compiled, eager)
