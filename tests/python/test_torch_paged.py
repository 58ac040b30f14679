"""fusedattn.torch.paged_attention without a GPU: which calls its C++ path is offered and with which
config (the general path's, so both build the same spec), what the C++ path leaves to the general
one, the tables and lengths refused in named words, the operator's schema (opcheck, with a CPU
stand-in body) and torch.compile tracing a decode step in one graph on meta tensors."""
import types

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn import InvalidArgumentError, _config  # noqa: E402
from fusedattn.torch import _call_config, _operators, _paged, _tensors  # noqa: E402
from meta_tensors import meta  # noqa: E402

B, PAGES, POOL, PAGE, H_Q, H_KV, D = 4, 16, 70, 64, 32, 8, 128


def decode(device="meta", layout="bshd", cache_layout="bshd"):
    """q (one token a sequence), the pools, the tables and the lengths of a decode step."""
    q = torch.empty((B, 1, H_Q, D) if layout == "bshd" else (1, B, H_Q, D), device=device, dtype=torch.bfloat16)
    pool_shape = (POOL, PAGE, H_KV, D) if cache_layout == "bshd" else (PAGE, POOL, H_KV, D)
    pool = torch.empty(pool_shape, device=device, dtype=torch.bfloat16)
    table = torch.zeros(B, PAGES, device=device, dtype=torch.int32)
    lengths = torch.full((B,), PAGE, device=device, dtype=torch.int32)
    return q, pool, pool, table, table, lengths


def test_eager_dense_calls_are_offered_to_cpp_with_the_general_paths_config(monkeypatch):
    offered = []

    def paged_forward(*args):
        offered.append(args)
        return NotImplemented  # then the general path runs the call, on meta tensors
    monkeypatch.setattr(fa, "_fast", types.SimpleNamespace(paged_forward=paged_forward))
    for layout, cache_layout in (("bshd", "bshd"), ("sbhd", "sbhd"), ("bshd", "sbhd")):
        args = decode(layout=layout, cache_layout=cache_layout)
        assert fa.paged_attention(*args, layout=layout, cache_layout=cache_layout, window=[128, -1]).shape == \
            args[0].shape
        *tensors, seq_len_q, config_id, scale, descale_k, descale_v = offered[-1]
        assert all(a is b for a, b in zip(tensors, args)) and seq_len_q is None and scale is None
        assert descale_k is None and descale_v is None
        text = _call_config.config_text(layout=layout, kv_layout=cache_layout, causal=True, window=(128, -1),
                                        align="bottom_right", padding=True, stats=False, kv_pages=PAGES)
        assert config_id == _config.parse(text).id  # one config, one spec: the general path's
    speculative = torch.full((B,), 1, device="meta", dtype=torch.int32)
    fa.paged_attention(*decode(), seq_len_q=speculative)
    assert offered[-1][6] is speculative and len(offered) == 4
    cu = torch.zeros(B + 1, device="meta", dtype=torch.int32)
    q = meta(B, H_Q, D, grad=False)
    fa.paged_attention(q, *decode()[1:], layout="thd", cu_seqlens_q=cu, max_seqlen_q=1)
    assert len(offered) == 4  # thd queries take the general path


def test_the_cpp_path_leaves_what_it_does_not_run_to_the_general_path():
    fast = pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    args = decode(device="cpu")
    paged_id = _paged.config_id("bshd", "bshd", True, (-1, -1), "bottom_right", args[3].shape)
    assert fast.paged_forward(*args, None, paged_id, None, None, None) is NotImplemented  # not on a GPU
    plain_id = fa._plain_config_id("bshd", False, (-1, -1), "top_left", False, "vanilla", False)
    assert fast.paged_forward(*args, None, plain_id, None, None, None) is NotImplemented  # not a paged config
    k8 = args[1].to(torch.float8_e4m3fn)
    one = torch.ones(1)
    assert fast.paged_forward(args[0], k8, k8, *args[3:], None, paged_id, None, one, one) is NotImplemented
    with pytest.raises(InvalidArgumentError) as caught:
        fast.paged_forward(*args[:3], "table", *args[4:], None, paged_id, None, None, None)
    assert caught.value.field == "page_table_k" and caught.value.requirement == "a torch.Tensor"
    with pytest.raises(InvalidArgumentError) as caught:
        fast.paged_forward(*args, 1, paged_id, None, None, None)
    assert caught.value.field == "seq_len_q"
    with pytest.raises(InvalidArgumentError) as caught:
        fast.paged_forward(*args, None, paged_id, None, 0.5, None)
    assert caught.value.field == "descale_k"
    with pytest.raises(InvalidArgumentError) as caught:
        fast.paged_forward(*args, None, 1 << 20, None, None, None)
    assert caught.value.field == "config_id"
    with pytest.raises(InvalidArgumentError) as caught:
        fast.paged_forward(*args)
    assert caught.value.field == "arguments"


def test_a_table_that_is_not_b_by_pages_gives_a_config_the_cpp_path_leaves():
    for shape in ((B,), (B, 0), (1, B, PAGES)):
        config_id = _paged.config_id("bshd", "bshd", True, (-1, -1), "bottom_right", torch.Size(shape))
        assert config_id == _config.config("bshd", "bshd", causal=True, align="bottom_right", padding=True,
                                           stats=False).id  # no kv_pages: not a paged call


def message(call):
    with pytest.raises(InvalidArgumentError) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("position, bad, field, requirement", [
    (3, torch.zeros(B + 1, PAGES, dtype=torch.int32), "page_table_k.shape",
     f"[{B},{PAGES}]: a row of {PAGES} pages (as page_table_k has) for each of the query's {B} sequences"),
    (4, torch.zeros(B, PAGES - 1, dtype=torch.int32), "page_table_v.shape",
     f"[{B},{PAGES}]: a row of {PAGES} pages (as page_table_k has) for each of the query's {B} sequences"),
    (5, torch.zeros(B, 1, dtype=torch.int32), "seq_len_kv.shape",
     f"[{B}]: one length for each of the query's {B} sequences"),
    (3, torch.zeros(B, PAGES, dtype=torch.int64), "page_table_k.dtype", "int32"),
    (5, torch.zeros(B, dtype=torch.int64), "seq_len_kv.dtype", "int32"),
    (3, torch.zeros(B * PAGES, dtype=torch.int32), "page_table_k.shape", "[b, pages a sequence], at least one page"),
])
def test_tables_and_lengths_are_checked_against_the_query(position, bad, field, requirement):
    args = list(decode())
    args[position] = bad.to("meta")
    error = message(lambda: fa.paged_attention(*args))
    assert (error.field, error.requirement) == (field, requirement)


def test_seq_len_q_and_devices_are_checked():
    args = decode()
    error = message(lambda: fa.paged_attention(*args, seq_len_q=meta(B + 1, dtype=torch.int32, grad=False)))
    assert error.field == "seq_len_q.shape"
    on_cpu = list(args)
    on_cpu[4] = torch.zeros(B, PAGES, dtype=torch.int32)
    error = message(lambda: fa.paged_attention(*on_cpu))
    assert error.field == "page_table_v.device" and error.requirement == "q's device, meta"


def test_a_table_view_with_gaps_runs_as_its_contiguous_copy(monkeypatch):
    """The core reads tables by address as dense rows: the general path hands it a copy."""
    seen = {}

    def body(q, k, v, *, extras, **kwargs):
        seen.update(k=extras.page_table_k, kv=extras.seq_len_kv)
        return q.new_empty(q.shape), None, None
    monkeypatch.setattr(_operators, "forward_body", body)
    q, pool, _, _, _, lengths = decode(device="cpu")
    wide = torch.arange(B * 2 * PAGES, dtype=torch.int32).reshape(B, 2 * PAGES)
    table = wide[:, :PAGES]
    monkeypatch.setattr(_operators, "eager_road", lambda *tensors: True)
    monkeypatch.setattr(_paged, "require_one_cuda_device", lambda *a, **k: None)
    fa.paged_attention(q, pool, pool, table, table, lengths)
    assert seen["k"].is_contiguous() and torch.equal(seen["k"], table)


def stand_in_body(q, k, v, *, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv):
    """A CPU stand-in for the CUDA body: O of the fake's shape, from q and the lengths, so that
    opcheck compares real values."""
    _call_config.call_spec(q, k, v, bias=bias, extras=extras, config=config, max_seqlen_q=max_seqlen_q,
                           max_seqlen_kv=max_seqlen_kv)
    return q * extras.seq_len_kv.to(q.dtype).reshape(-1, 1, 1, 1), None, None


def test_opcheck_of_the_operator_compiled_code_calls(monkeypatch):
    monkeypatch.setattr(_operators, "forward_body", stand_in_body)
    q, pool, _, table, _, lengths = decode(device="cpu")
    q = torch.randn(q.shape, dtype=torch.bfloat16)
    config = _call_config.config_text(layout="bshd", kv_layout="bshd", causal=True, align="bottom_right",
                                      padding=True, stats=False, kv_pages=PAGES)
    extras = _tensors.Extras(seq_len_kv=lengths, page_table_k=table, page_table_v=table).as_list()
    torch.library.opcheck(torch.ops.fusedattn.forward.default, (q, pool, pool, None, None, extras, config, 0.125, 0, 0))


@pytest.mark.parametrize("layout, cache_layout", [("bshd", "bshd"), ("sbhd", "bshd"), ("bshd", "sbhd")])
def test_a_decode_step_compiles_in_one_graph(layout, cache_layout):
    torch._dynamo.reset()

    def step(*args):
        return fa.paged_attention(*args, layout=layout, cache_layout=cache_layout) * 2
    args = decode(layout=layout, cache_layout=cache_layout)
    assert torch.compile(step, fullgraph=True, backend="aot_eager")(*args).shape == args[0].shape


def fp8_decode(per_head, device="meta", layout="bshd"):
    """A decode step over E4M3 pools, and a descale ([h_kv] per head, else [1]) for both."""
    q, pool, _, table, _, lengths = decode(device, layout=layout)
    pool8 = torch.empty(pool.shape, device=device, dtype=torch.float8_e4m3fn)
    return (q, pool8, pool8, table, table, lengths), torch.ones(H_KV if per_head else 1, device=device)


@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
def test_fp8_caches_are_offered_to_cpp_with_their_descales_and_scaling(monkeypatch, per_head):
    offered = []

    def paged_forward(*args):
        offered.append(args)
        return NotImplemented
    monkeypatch.setattr(fa, "_fast", types.SimpleNamespace(paged_forward=paged_forward))
    args, descale = fp8_decode(per_head)
    out = fa.paged_attention(*args, descale_k=descale, descale_v=descale * 2)
    assert out.shape == args[0].shape and out.dtype == torch.bfloat16  # O in q's dtype, by the general path
    *_, config_id, scale, descale_k, descale_v = offered[-1]
    assert descale_k is descale and descale_v is not descale and descale_v.shape == descale.shape
    text = _call_config.config_text(layout="bshd", kv_layout="bshd", causal=True, align="bottom_right", padding=True,
                                    stats=False, kv_pages=PAGES, fp8_scaling="head" if per_head else "")
    assert config_id == _config.parse(text).id and ("fp8_scaling=head" in text) == per_head


def test_the_general_path_hands_the_descales_to_the_body_by_address(monkeypatch):
    seen = {}

    def body(q, k, v, *, extras, config, **kwargs):
        seen.update(extras.addresses(), config=config)
        return q.new_empty(q.shape), None, None
    monkeypatch.setattr(_operators, "forward_body", body)
    monkeypatch.setattr(_operators, "eager_road", lambda *tensors: True)
    monkeypatch.setattr(_paged, "require_one_cuda_device", lambda *a, **k: None)
    monkeypatch.setattr(fa, "_fast", None)
    args, descale = fp8_decode(True, device="cpu")
    descale_v = torch.ones(2 * H_KV)[::2]  # a view with gaps: the core gets a contiguous copy
    fa.paged_attention(*args, descale_k=descale, descale_v=descale_v)
    assert seen["descale_k"] == descale.data_ptr() and seen["descale_v"] not in (0, descale_v.data_ptr())
    assert "fp8_scaling=head" in seen["config"]


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_an_fp8_cache_decode_step_compiles_in_one_graph(layout):
    torch._dynamo.reset()
    args, descale = fp8_decode(True, layout=layout)

    def step(*args):
        return fa.paged_attention(*args, layout=layout, descale_k=descale, descale_v=descale) * 2
    assert torch.compile(step, fullgraph=True, backend="aot_eager")(*args).shape == args[0].shape
