"""Probe on the GPU (issue 17): how fast cuDNN's dense ragged kernel reads a decode's keys when
every page of 64 keys is an entry of its own, the form a split decode could give one cuDNN call
over a "bshd" pool ([pages, page_size, h_kv, d]: a page's tokens are a thd sequence) with ragged
offsets from the page table. Beside it, cuDNN's paged kernel as the split decode calls it today
(its kernel alone, from the profiler) and PyTorch's dense cuDNN call on the same keys. Contiguous
pages here: the ragged kernel reads where its offsets say, so the order of pages does not change
what it reads. Kernel times only; the merge over the entries is not included.

    PYTHONPATH=build-gpu/python python3 scripts/probe_page_entries.py
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import fusedattn.torch as fa  # noqa: E402
from harness import kernel_times  # noqa: E402

BF16 = torch.bfloat16
H_Q, H_KV, D, PAGE = 32, 8, 128, 64


def kernels(step):
    """(µs a call of cuDNN's kernels, µs of every kernel, [(name, µs)]) from the profiler."""
    rows = [(name, ms * 1000.0) for name, _, ms in kernel_times(step, steps=10)]
    return sum(us for n, us in rows if n.startswith("cudnn")), sum(us for _, us in rows), rows


def entries_call(b, s_kv, keys_per_entry, folded):
    """One ragged call: each entry `keys_per_entry` keys of one sequence, its queries folded (the g
    query heads of a K/V head as g rows of one head) or not."""
    entries = b * s_kv // keys_per_entry
    g = H_Q // H_KV
    rows, heads = (g, H_KV) if folded else (1, H_Q)
    q = torch.randn(entries * rows, heads, D, device="cuda", dtype=BF16)
    k = torch.randn(entries * keys_per_entry, H_KV, D, device="cuda", dtype=BF16)
    v = torch.randn_like(k)
    cu_q = torch.arange(0, entries + 1, device="cuda", dtype=torch.int32) * rows
    cu_kv = torch.arange(0, entries + 1, device="cuda", dtype=torch.int32) * keys_per_entry

    def step():
        fa.attention(q, k, v, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=rows,
                     max_seqlen_kv=keys_per_entry, return_stats=True)
    return step


def split_paged_call(b, s_kv):
    """fusedattn.torch.paged_attention over a shuffled bshd pool: the split decode as it is."""
    pages = s_kv // PAGE
    k_pool = torch.randn(b * pages, PAGE, H_KV, D, device="cuda", dtype=BF16)
    v_pool = torch.randn_like(k_pool)
    table = torch.randperm(b * pages, device="cuda", dtype=torch.int32).reshape(b, pages)
    lengths = torch.full((b,), s_kv, device="cuda", dtype=torch.int32)
    q = torch.randn(b, 1, H_Q, D, device="cuda", dtype=BF16)

    def step():
        fa.paged_attention(q, k_pool, v_pool, table, table, lengths)
    return step


def dense_torch_call(b, s_kv):
    q = torch.randn(b, H_Q, 1, D, device="cuda", dtype=BF16)
    k = torch.randn(b, H_KV, s_kv, D, device="cuda", dtype=BF16)
    v = torch.randn_like(k)

    def step():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return step


def main():
    print("µs a call of cuDNN's kernels and of all kernels (torch.profiler, 10 calls), h 32/8, d 128, bf16,")
    print("one query; fraction: K and V bytes over cuDNN's time over 4.26 TB/s (earlier runs' copy bandwidth)")
    cases = [(1, 8192), (1, 32768), (8, 2048), (8, 8192)]
    forms = [("split paged (today)", split_paged_call),
             ("dense, PyTorch cuDNN", dense_torch_call),
             ("page entries, folded", lambda b, s: entries_call(b, s, 64, True)),
             ("page entries", lambda b, s: entries_call(b, s, 64, False)),
             ("2-page entries, folded", lambda b, s: entries_call(b, s, 128, True)),
             ("4-page entries, folded", lambda b, s: entries_call(b, s, 256, True))]
    for b, s_kv in cases:
        bytes_kv = 2 * b * s_kv * H_KV * D * 2
        print(f"--- b={b} s_kv={s_kv} ({bytes_kv / 2**20:.0f} MiB of K and V)")
        for label, make in forms:
            try:
                ours, every, rows = kernels(make(b, s_kv))
                fraction = bytes_kv / (ours * 1e-6) / 4.26e12 if ours else float("nan")
                print(f"  {label:24s} cuDNN {ours:7.1f} µs ({fraction:4.2f}), all {every:7.1f}   " +
                      "; ".join(f"{n[:60]} {t:.1f}" for n, t in rows[:3]))
            except Exception as error:  # one form refused must not hide the others
                print(f"  {label:24s} failed: {str(error).splitlines()[0][:200]}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
