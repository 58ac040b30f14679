#!/usr/bin/env python3
"""Nsight Compute over one decode call's kernels: how long each ran, how much of the DRAM bandwidth
it drew, how many warps were active and what they stalled on (one query, h 32/8, d 128, BF16). Each
configuration is a process of its own under `ncu`: fusedattn.torch.attention on a contiguous cache as
the rule cuts it, and again cut into each count of --cuts (FUSEDATTN_DECODE_KERNEL=1
FUSEDATTN_DECODE_CHUNKS=n), paged_attention over 64-token pages, and PyTorch's dense cuDNN call on the
same cache. A diagnostic for the decode kernel's memory pipeline, not a benchmark: ncu serializes
kernels and times each alone.

    FUSEDATTN_PYTHON_BUILD=build/python python bench/ncu_decode.py [--points 1,8192 8,8192] [--cuts 16 32]
"""
import argparse
import csv
import io
import os
import shutil
import subprocess
import sys

CALLS_BEFORE = 8  # calls a profiled process makes before the one ncu reads (plans built, caches warm)
METRICS = ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum",
           "lts__t_sector_hit_rate.pct", "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__grid_size",
           "launch__block_size", "launch__registers_per_thread"]
STALLS = ["long_scoreboard", "barrier", "short_scoreboard", "wait", "math_pipe_throttle", "mio_throttle",
          "lg_throttle", "selected"]
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"  # a ratio: its name takes .ratio
METRICS += [STALL_METRIC.format(stall) for stall in STALLS]


def one_call(road, batch, keys):
    """The profiled process: CALLS_BEFORE calls of `road` over a fresh cache, then the one ncu reads."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.environ.get("FUSEDATTN_PYTHON_BUILD", "build/python"))
    import fusedattn.torch as fa
    q = torch.rand(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.rand(batch, keys, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.rand_like(k)
    if road == "paged":
        pool_k, pool_v = k.reshape(-1, 64, 8, 128), v.reshape(-1, 64, 8, 128)
        table = torch.randperm(pool_k.shape[0], device="cuda", dtype=torch.int32).reshape(batch, -1)
        lengths = torch.full((batch,), keys, device="cuda", dtype=torch.int32)
        call = lambda: fa.paged_attention(q, pool_k, pool_v, table, table, lengths, causal=True)  # noqa: E731
    elif road == "torch":
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        backend = torch.nn.attention.SDPBackend.CUDNN_ATTENTION
        def call():
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    else:
        call = lambda: fa.attention(q, k, v, causal=True, align="bottom_right")  # noqa: E731
    for _ in range(CALLS_BEFORE):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()  # ncu reads only what runs from here (--profile-from-start off)
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def profiled(road, batch, keys, env):
    """ncu over the kernels of the last call of a process running `road`: (metrics, units) a kernel."""
    command = ["ncu", "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base",
               "--metrics", ",".join(METRICS), "--profile-from-start", "off",
               sys.executable, __file__, "--one", road, str(batch), str(keys)]
    done = subprocess.run(command, env=dict(os.environ, **env), capture_output=True, text=True, check=False)
    rows = [row for row in csv.reader(io.StringIO(done.stdout)) if len(row) > 10]
    if not rows:
        print(f"  ncu gave no rows (exit {done.returncode}): {done.stderr.strip()[-300:]}")
        return []
    units = dict(zip(rows[0], rows[1]))
    return [(dict(zip(rows[0], row)), units) for row in rows[2:]]


def show(kernels):
    """Each kernel's metrics, named short, with their units."""
    short = {"gpu__time_duration.sum": "time", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM of peak",
             "dram__bytes_read.sum": "DRAM read", "lts__t_sector_hit_rate.pct": "L2 hits",
             "sm__warps_active.avg.pct_of_peak_sustained_active": "warps active", "launch__grid_size": "blocks",
             "launch__block_size": "threads", "launch__registers_per_thread": "registers"}
    for kernel, units in kernels:
        print(f"  {kernel.get('Kernel Name', '')[:100]}")
        print("    " + ", ".join(f"{name} {kernel.get(metric, '?')} {units.get(metric, '')}".rstrip()
                                 for metric, name in short.items()))
        stalls = (f"{stall} {kernel.get(STALL_METRIC.format(stall), '?')}" for stall in STALLS)
        print("    warps stalled, by reason, per instruction issued: " + ", ".join(stalls), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", nargs="*", default=["1,8192"], help="batch,keys of one query each")
    parser.add_argument("--cuts", nargs="*", type=int, default=[16, 32], help="chunk counts forced on the kernel")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_call(args.one[0], int(args.one[1]), int(args.one[2]))
        return
    if shutil.which("ncu") is None:
        raise SystemExit("ncu_decode: Nsight Compute (ncu) is not on the PATH")
    forced = {"FUSEDATTN_DECODE_KERNEL": "1"}
    for point in args.points:
        batch, keys = (int(x) for x in point.split(","))
        configurations = [("contiguous, as the rule cuts it", "fa", {}), ("paged, as the rule runs it", "paged", {})]
        configurations += [(f"contiguous in {n} chunks", "fa", dict(forced, FUSEDATTN_DECODE_CHUNKS=str(n)))
                           for n in args.cuts]
        configurations.append(("PyTorch's dense cuDNN call", "torch", {}))
        for label, road, env in configurations:
            print(f"\n== b={batch} s_kv={keys}: {label}", flush=True)
            show(profiled(road, batch, keys, env))


if __name__ == "__main__":
    main()
