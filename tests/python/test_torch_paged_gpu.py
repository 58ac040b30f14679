"""fusedattn.torch's paged caches on a GPU, against float32 math attention of each sequence's gathered
keys (torch_reference.py): a decode step in both cache layouts, a decode step captured in a CUDA
graph and replayed with new lengths and queries, and a ragged speculative step."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)
fa = pytest.importorskip("fusedattn.torch")

from torch_reference import reference, rel  # noqa: E402


@pytest.mark.parametrize("cache_layout", ["bshd", "sbhd"])
def test_paged_decode_matches_attention_on_the_gathered_cache(cache_layout):
    b, s_kv, page, h_q, h_kv, d = 4, 1024, 64, 16, 4, 128
    per_seq = s_kv // page
    k = torch.rand(b, s_kv, h_kv, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    v = torch.rand_like(k) * 2 - 1
    q = torch.rand(b, 1, h_q, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    pages = b * per_seq + 5
    order = torch.randperm(pages, device="cuda")[: b * per_seq]
    table = order.to(torch.int32).reshape(b, per_seq)

    def pool_of(x):  # each sequence's pages scattered to the table's pool pages
        pool = torch.zeros(pages, page, h_kv, d, device="cuda", dtype=x.dtype)
        pool[order] = x.reshape(b * per_seq, page, h_kv, d)
        return pool if cache_layout == "bshd" else pool.transpose(0, 1).contiguous()
    lengths = torch.tensor([1024, 1, 700, 64], device="cuda", dtype=torch.int32)
    o = fa.paged_attention(q, pool_of(k), pool_of(v), table, table, lengths, cache_layout=cache_layout)
    for i in range(b):
        n = int(lengths[i])
        ref, _ = reference(q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], "bshd")
        assert rel(o[i:i + 1], ref) < 1e-2


@pytest.mark.parametrize("batch, s_kv", [(1, 8192), (64, 1024)])  # split on an H200, and not
def test_a_captured_decode_step_replays_with_new_lengths_and_queries(batch, s_kv):
    """A serving engine's decode step: captured once, replayed with new queries and lengths written
    in place; seq_len_q left out (every sequence's one query). Outputs poisoned before each replay."""
    page, h_q, h_kv, d = 64, 32, 8, 128
    per_seq = s_kv // page
    k_pool = torch.rand(batch * per_seq, page, h_kv, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    v_pool = torch.rand_like(k_pool) * 2 - 1
    table = torch.randperm(batch * per_seq, device="cuda").to(torch.int32).reshape(batch, per_seq)
    q = torch.empty(batch, 1, h_q, d, device="cuda", dtype=torch.bfloat16)
    lengths = torch.full((batch,), s_kv, device="cuda", dtype=torch.int32)
    with torch.no_grad():
        fa.paged_attention(q.uniform_(-1, 1), k_pool, v_pool, table, table, lengths)  # the plan, built outside
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fa.paged_attention(q, k_pool, v_pool, table, table, lengths)
        for step in range(3):
            q.uniform_(-1, 1)
            lengths.copy_(torch.randint(1, s_kv + 1, (batch,), device="cuda", dtype=torch.int32))
            lengths[0] = (s_kv, 1, s_kv - 37)[step]
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for i in range(batch):
                n = int(lengths[i])
                keys = [pool[table[i].long()].reshape(1, s_kv, h_kv, d)[:, :n] for pool in (k_pool, v_pool)]
                ref, _ = reference(q[i:i + 1], *keys, "bshd")
                assert rel(out[i:i + 1], ref) < 1e-2, (step, i, n)


def test_a_ragged_speculative_step_over_pages_matches_float32():
    """thd queries (1 and 3 a sequence, and an empty one) over a paged cache, bottom-right causal:
    split on an H200 into 5 chunks and the masked call, against each sequence's float32 attention."""
    page, h_q, h_kv, d, s_kv = 64, 32, 8, 128, 4096
    queries, keys = [1, 0, 3], [4096, 0, 2001]
    per_seq = s_kv // page
    b = len(queries)
    k_pool = torch.rand(b * per_seq, page, h_kv, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    v_pool = torch.rand_like(k_pool) * 2 - 1
    table = torch.randperm(b * per_seq, device="cuda").to(torch.int32).reshape(b, per_seq)
    q = torch.rand(sum(queries), h_q, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    cu = torch.tensor([0, 1, 1, 4], device="cuda", dtype=torch.int32)
    lengths = torch.tensor(keys, device="cuda", dtype=torch.int32)
    with torch.no_grad():
        o = fa.paged_attention(q, k_pool, v_pool, table, table, lengths, layout="thd", cu_seqlens_q=cu,
                               max_seqlen_q=max(queries))
    assert o.shape == q.shape
    for i in (0, 2):
        start, n = int(cu[i]), keys[i]
        gathered = [pool[table[i].long()].reshape(1, s_kv, h_kv, d)[:, :n] for pool in (k_pool, v_pool)]
        ref, _ = reference(q[start:start + queries[i]].unsqueeze(0), *gathered, "bshd", causal=True,
                           align="bottom_right")
        assert rel(o[start:start + queries[i]].unsqueeze(0), ref) < 1e-2, i


def quantized(x, per_head):
    """x [..., h_kv, d] in E4M3 with its float32 descales (one, or one a K/V head: [h_kv]), as a
    serving engine keeps a cache: x ~ x8 * descale."""
    amax = x.float().abs().amax(dim=tuple(range(x.dim() - 2)) + (x.dim() - 1,)) if per_head else x.float().abs().max()
    descale = (amax / 448.0).reshape(-1).contiguous()
    x8 = (x.float() / descale.reshape(-1, 1)).to(torch.float8_e4m3fn)
    return x8, descale


@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
@pytest.mark.parametrize("road", ["cpp", "general"])
def test_fp8_caches_match_attention_on_the_dequantized_cache(per_head, road, monkeypatch):
    """E4M3 pools with their descales beside a bf16 q (fusedattn's decode kernel): one and four query
    tokens a sequence, ragged lengths (1, a page plus one, a full cache), against float32 attention
    on the dequantized gathered keys, by the C++ path and the general one; O poisoned first."""
    if road == "general":
        monkeypatch.setattr(fa, "_fast", None)
    b, s_kv, page, h_q, h_kv, d = 3, 4096, 64, 32, 8, 128
    per_seq = s_kv // page
    k_pool, descale_k = quantized(torch.randn(b * per_seq, page, h_kv, d, device="cuda"), per_head)
    v_pool, descale_v = quantized(torch.randn(b * per_seq, page, h_kv, d, device="cuda"), per_head)
    table = torch.randperm(b * per_seq, device="cuda").to(torch.int32).reshape(b, per_seq)
    lengths = torch.tensor([s_kv, 1, page + 1], device="cuda", dtype=torch.int32)
    for s_q in (1, 4):
        q = torch.randn(b, s_q, h_q, d, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            o = fa.paged_attention(q, k_pool, v_pool, table, table, lengths, descale_k=descale_k,
                                   descale_v=descale_v)
        assert o.dtype == q.dtype and o.shape == q.shape
        for i in range(b):
            n = int(lengths[i])
            if n < s_q:
                continue  # bottom-right causal: rows with no key
            keys = [(pool[table[i].long()].reshape(s_kv, h_kv, d)[:n].float() * descale.reshape(-1, 1))[None]
                    for pool, descale in ((k_pool, descale_k), (v_pool, descale_v))]
            ref, _ = reference(q[i:i + 1], *keys, "bshd", causal=True, align="bottom_right")
            assert rel(o[i:i + 1], ref) < 1e-2, (s_q, i, n)


def test_an_fp8_cache_decode_step_captures_and_replays():
    """A decode step over an FP8 cache captured in a CUDA graph, replayed with new queries, lengths
    and descales written in place."""
    batch, s_kv, page, h_q, h_kv, d = 2, 8192, 64, 32, 8, 128
    per_seq = s_kv // page
    k_pool, descale_k = quantized(torch.randn(batch * per_seq, page, h_kv, d, device="cuda"), True)
    v_pool, descale_v = quantized(torch.randn(batch * per_seq, page, h_kv, d, device="cuda"), True)
    table = torch.randperm(batch * per_seq, device="cuda").to(torch.int32).reshape(batch, per_seq)
    q = torch.randn(batch, 1, h_q, d, device="cuda", dtype=torch.bfloat16)
    lengths = torch.full((batch,), s_kv, device="cuda", dtype=torch.int32)
    with torch.no_grad():
        fa.paged_attention(q, k_pool, v_pool, table, table, lengths, descale_k=descale_k, descale_v=descale_v)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fa.paged_attention(q, k_pool, v_pool, table, table, lengths, descale_k=descale_k,
                                     descale_v=descale_v)
        for step in range(2):
            q.normal_()
            lengths.copy_(torch.tensor([s_kv - 100 * step, 513], device="cuda", dtype=torch.int32))
            descale_v.mul_(2.0)  # the values it reads are the tensors' contents at replay
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for i in range(batch):
                n = int(lengths[i])
                keys = [(pool[table[i].long()].reshape(s_kv, h_kv, d)[:n].float() * descale.reshape(-1, 1))[None]
                        for pool, descale in ((k_pool, descale_k), (v_pool, descale_v))]
                ref, _ = reference(q[i:i + 1], *keys, "bshd")
                assert rel(out[i:i + 1], ref) < 1e-2, (step, i, n)
