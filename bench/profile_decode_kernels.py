#!/usr/bin/env python3
"""Where a decode call's time goes: torch.profiler over fusedattn.torch.paged_attention (h 32/8,
d 128, 64-token pages, BF16), over fusedattn.torch.attention on a contiguous copy of the same cache,
and over PyTorch's dense cuDNN call on that copy: kernels grouped by name, per call, and the timeline
of two calls in a row (each kernel's start and end, and the gap before it). `--paths kernel cudnn`
runs the calls again in a process for each path forced (FUSEDATTN_DECODE_KERNEL=1 and 0: fusedattn's
decode kernel, cuDNN's split decode), so their kernels can be set side by side. Then, unless
--no-sweep, the split calls' times with each chunk count forced (FUSEDATTN_SPLIT_DECODE=n, a process
each); with --kernel-cuts, the calls on fusedattn's decode kernel cut into each chunk count
(FUSEDATTN_DECODE_CHUNKS=n); the calls' times again with our kernels launched late
(FUSEDATTN_DECODE_EARLY_LAUNCH=0); and, with --cudnn-sweep, cuDNN's paged call alone over the same keys cut into E entries of P pages (what a
split's chunks call is). Each call is timed on a stream and captured in a CUDA graph. A diagnostic,
not a benchmark.

    FUSEDATTN_PYTHON_BUILD=build/python python bench/profile_decode_kernels.py [--paths kernel cudnn]
        [--no-sweep] [--cudnn-sweep] [--points 1,1,8192 8,1,32768] [--kernel-cuts 16 33]
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.environ.get("FUSEDATTN_PYTHON_BUILD", "build/python"))
sys.path.insert(0, str(Path(__file__).parent))
import fusedattn.torch as fa  # noqa: E402
from harness import captured_median_ms, cuda_median_ms, kernel_timeline, kernel_times  # noqa: E402

H_Q, H_KV, D, PAGE = 32, 8, 128, 64
PATHS = {"kernel": "1", "cudnn": "0"}
POINTS = [(1, 1, 8192), (1, 1, 32768), (1, 1, 131072), (8, 1, 2048), (8, 1, 8192), (8, 1, 32768), (4, 8, 8192),
          (1, 16, 32768)]


def cache(batch, seq_kv, queries, group=1):
    """q [batch, queries * group, H_Q / group, D] and a shuffled page pool of batch * seq_kv keys."""
    pages = batch * seq_kv // PAGE
    k = torch.rand(pages, PAGE, H_KV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.rand_like(k)
    q = torch.rand(batch, queries * group, H_Q // group, D, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(batch, -1)
    return q, k, v, table


def timed(label, call, kernels):
    """One call's time on a stream and captured, then (with kernels) its kernels and timeline."""
    us = cuda_median_ms(call, 3, 20) * 1e3
    graph_us = captured_median_ms(call, 3, 20) * 1e3
    print(f"\n{label}: {us:.1f} us a call (events), {graph_us:.1f} us captured in a CUDA graph", flush=True)
    if kernels:
        for name, count, ms in kernel_times(call, 10):
            print(f"  {ms * 1e3:8.1f} us  x{count}  {name[:110]}")
        print_timeline(kernel_timeline(call, 4))


def decode_calls(points, kernels=True, paged_only=False):
    """Each point's paged call, its contiguous call and PyTorch's dense call on the contiguous copy."""
    for batch, queries, seq_kv in points:
        q, k, v, table = cache(batch, seq_kv, queries)
        lengths = torch.full((batch,), seq_kv, device="cuda", dtype=torch.int32)
        causal = queries == 1
        point = f"b={batch} s_q={queries} s_kv={seq_kv}"
        timed(f"paged {point}", lambda: fa.paged_attention(q, k, v, table, table, lengths, causal=causal), kernels)
        if not paged_only:
            kc = k[table.long()].reshape(batch, seq_kv, H_KV, D)
            vc = v[table.long()].reshape(batch, seq_kv, H_KV, D)
            timed(f"contiguous {point}",
                  lambda: fa.attention(q, kc, vc, causal=causal, align="bottom_right"), kernels)
            qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                timed(f"PyTorch dense cuDNN {point} (not causal)",
                      lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), kernels)


def print_timeline(kernels):
    """The kernels of the middle two of the calls (start, end, gap from the previous kernel's end, µs;
    a negative gap: launched early, waiting beside it)."""
    calls = 4
    per_call = len(kernels) // calls
    if per_call == 0:
        return
    shown = kernels[per_call:3 * per_call]
    print("  timeline of two calls (us: start, end, gap before it):")
    previous_end, origin = kernels[per_call - 1][2], shown[0][1]
    for name, start, end in shown:
        print(f"    {start - origin:7.1f} {end - origin:7.1f} {start - previous_end:+6.1f}  {name[:80]}")
        previous_end = end


def chunks_sweep():
    """The split calls' times with each chunk count forced, a process each (the switch is read once)."""
    for chunks in (2, 4, 8, 16, 32, 64):
        print(f"\n== FUSEDATTN_SPLIT_DECODE={chunks} (every split call in {chunks} chunks, fewer where pages run out)",
              flush=True)
        subprocess.run([sys.executable, __file__, "--split-only", "--times-only"],
                       env=dict(os.environ, FUSEDATTN_SPLIT_DECODE=str(chunks)), check=False)


def chunk_sweep():
    """cuDNN's paged call over b sequences of s_kv keys, each cut into c chunks: b * c entries of
    s_kv / 64 / c pages, no mask, as a split's chunks call runs them: one query unfolded (one row of
    32 heads), 16 folded (64 rows of 8 heads). And PyTorch's dense cuDNN call over one sequence."""
    for batch, seq_kv in ((1, 8192), (1, 32768), (8, 8192), (8, 32768)):
        for queries, group in ((1, 1), (16, 4)):
            for chunks in (2, 4, 8, 16, 32):
                pages = seq_kv // PAGE // chunks
                entries = batch * chunks
                q, k, v, table = cache(entries, pages * PAGE, queries, group)
                lengths = torch.full((entries,), pages * PAGE, device="cuda", dtype=torch.int32)
                us = cuda_median_ms(lambda: fa.paged_attention(q, k, v, table, table, lengths, causal=False),
                                    3, 20) * 1e3
                fraction = 2 * k.numel() * 2 / (us * 1e-6) / 4.26e12
                print(f"b={batch} s_kv={seq_kv} s_q={queries} group={group} chunks={chunks} ({entries} entries of "
                      f"{pages} pages): {us:.1f} us ({fraction:.2f} of 4.26 TB/s)", flush=True)
    for seq_kv in (8192, 32768):
        qt = torch.rand(1, H_Q, 1, D, device="cuda", dtype=torch.bfloat16)
        kt = torch.rand(1, H_KV, seq_kv, D, device="cuda", dtype=torch.bfloat16)
        vt = torch.rand_like(kt)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            us = cuda_median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), 3, 20) * 1e3
            print(f"s_kv={seq_kv}: PyTorch cuDNN dense, one query: {us:.1f} us", flush=True)
            for name, count, ms in kernel_times(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), 10):
                print(f"  {ms * 1e3:8.1f} us  x{count}  {name[:110]}")


def parse_points(texts):
    return [tuple(int(x) for x in text.split(",")) for text in texts] if texts else POINTS


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true", help="cuDNN's call alone by chunks only (run unsplit)")
    parser.add_argument("--split-only", action="store_true", help="the paged calls only, in this process")
    parser.add_argument("--no-sweep", action="store_true", help="leave the sweep of forced chunk counts out")
    parser.add_argument("--cudnn-sweep", action="store_true", help="also cuDNN's call alone by chunks, unsplit")
    parser.add_argument("--times-only", action="store_true", help="the calls' times, no kernels")
    parser.add_argument("--paths", nargs="*", choices=sorted(PATHS), default=[],
                        help="the calls again in a process with each path forced")
    parser.add_argument("--points", nargs="*", help="b,s_q,s_kv points instead of the default list")
    parser.add_argument("--kernel-cuts", nargs="*", type=int, default=[],
                        help="the calls on the kernel cut into each of these chunk counts, a process each")
    args = parser.parse_args()
    points = parse_points(args.points)
    if args.sweep:
        chunk_sweep()
        return
    decode_calls(points, kernels=not args.times_only, paged_only=args.split_only)
    if args.split_only:
        return
    forwarded = ["--points", *[",".join(map(str, p)) for p in points]]
    for path in args.paths:
        print(f"\n== forced onto {path} (FUSEDATTN_DECODE_KERNEL={PATHS[path]})", flush=True)
        subprocess.run([sys.executable, __file__, "--no-sweep", *forwarded],
                       env=dict(os.environ, FUSEDATTN_DECODE_KERNEL=PATHS[path]), check=False)
    for chunks in args.kernel_cuts:
        print(f"\n== on the kernel in {chunks} chunks (FUSEDATTN_DECODE_KERNEL=1 FUSEDATTN_DECODE_CHUNKS={chunks})",
              flush=True)
        subprocess.run([sys.executable, __file__, "--no-sweep", "--times-only", *forwarded], check=False,
                       env=dict(os.environ, FUSEDATTN_DECODE_KERNEL="1", FUSEDATTN_DECODE_CHUNKS=str(chunks)))
    if not args.no_sweep:
        chunks_sweep()
        print("\n== the same with FUSEDATTN_DECODE_EARLY_LAUNCH=0 (our kernels launched after the previous one ends)",
              flush=True)
        subprocess.run([sys.executable, __file__, "--split-only", "--times-only", *forwarded],
                       env=dict(os.environ, FUSEDATTN_DECODE_EARLY_LAUNCH="0"), check=False)
    if args.cudnn_sweep:
        subprocess.run([sys.executable, __file__, "--sweep"], env=dict(os.environ, FUSEDATTN_SPLIT_DECODE="0"),
                       check=False)


if __name__ == "__main__":
    main()
