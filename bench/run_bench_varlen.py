#!/usr/bin/env python3
"""bench/run_bench_varlen.py — fusedattn's ragged and paged paths, side by side with PyTorch in one
process: a packed training step (host time per step, plan builds, TFLOP/s) and decode over a paged
cache (fraction of the memory bandwidth measured in the same run). Writes JSON and a markdown table.

    python bench/run_bench_varlen.py --build build   # writes results/bench-varlen.*

fusedattn runs through fusedattn_bench (bench/bench_module.cpp), which a build configured with
FUSEDATTN_PYTHON=ON puts in its python/ folder.
"""
import argparse
import datetime
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import Bench, captured_median_ms, cuda_median_ms, load, short

BF16 = torch.bfloat16


# --- packed training step ----------------------------------------------------------------------

def packing(rng, tokens, shortest, longest):
    """Sequence lengths, log-uniform in [shortest, longest], filling `tokens` (the last one trimmed)."""
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(min(int(math.exp(rng.uniform(math.log(shortest), math.log(longest)))), tokens - sum(lengths)))
    return lengths


def causal_flops(lengths, h, d):  # forward+backward: 3.5 x forward, forward = 4·h·(pairs)·d, causal pairs ~ s²/2
    return 3.5 * sum(4.0 * h * (n * n / 2) * d for n in lengths)


def padded_torch_step(lengths, h_q, h_kv, d, backend):
    """The dense alternative: every sequence padded to the longest, PyTorch SDPA, forward+backward."""
    b, s = len(lengths), max(lengths)
    q = torch.randn(b, h_q, s, d, device="cuda", dtype=BF16, requires_grad=True)
    k = torch.randn(b, h_kv, s, d, device="cuda", dtype=BF16, requires_grad=True)
    v = torch.randn(b, h_kv, s, d, device="cuda", dtype=BF16, requires_grad=True)
    do = torch.randn(b, h_q, s, d, device="cuda", dtype=BF16)

    def step():
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h_q != h_kv)
        out.backward(do)
    return step


def training_step(bench, args):
    """`args.steps` random packings of `args.tokens` tokens each, forward+backward: a first pass
    builds what it needs, a second pass over the same packings is timed."""
    h_q, h_kv, d = 32, 8, 128
    rng = random.Random(2026)
    packings = [packing(rng, args.tokens, 64, 8192) for _ in range(args.steps)]
    t = args.tokens
    q, o, do, dq = (torch.rand(t, h_q, d, device="cuda", dtype=BF16) for _ in range(4))
    k, v, dk, dv = (torch.rand(t, h_kv, d, device="cuda", dtype=BF16) for _ in range(4))
    stats = torch.empty(t, h_q, device="cuda", dtype=torch.float32)
    calls = []
    for lengths in packings:
        cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], device="cuda", dtype=torch.int32)
        spec = bench.spec_string("thd_thd_thd", len(lengths), max(lengths), max(lengths), h_q, h_kv, d, causal=True)
        calls.append((spec, len(lengths), cu, lengths))

    before = bench.cache_stats()
    for spec, n, cu, _ in calls:  # first pass: every bucket's plans get built here
        bench.ragged_step(spec, n, cu, q, k, v, o, stats, do, dq, dk, dv)
    torch.cuda.synchronize()
    first = bench.cache_stats()
    host = []
    torch.cuda._sleep(50_000_000)
    events = []
    for spec, n, cu, _ in calls:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        host.append(bench.ragged_step(spec, n, cu, q, k, v, o, stats, do, dq, dk, dv))
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    second = bench.cache_stats()
    gpu = [s.elapsed_time(e) for s, e in events]
    flops = sum(causal_flops(lengths, h_q, d) for *_, lengths in calls)
    result = {"tokens_per_step": args.tokens, "steps": args.steps, "h_q": h_q, "h_kv": h_kv, "d": d,
              "lengths": "log-uniform 64..8192, packed back to back", "example_spec": calls[0][0],
              "sequences_per_step_median": statistics.median(len(p) for p in packings),
              "plan_builds_first_pass": first["builds"] - before["builds"],
              "plan_builds_second_pass": second["builds"] - first["builds"],
              "fusedattn_host_us_per_step": statistics.median(host),
              "fusedattn_gpu_ms_per_step": statistics.median(gpu),
              "fusedattn_tflops": flops / (sum(gpu) * 1e-3) / 1e12}
    # The same packings padded to their longest sequence, through PyTorch (useful FLOPs only).
    for name, backend in (("torch_cudnn_padded", SDPBackend.CUDNN_ATTENTION),
                          ("torch_flash_padded", SDPBackend.FLASH_ATTENTION)):
        try:
            times = []
            for *_, lengths in calls[:min(len(calls), 20)]:
                times.append((cuda_median_ms(padded_torch_step(lengths, h_q, h_kv, d, backend), 2, 5), lengths))
            useful = sum(causal_flops(lengths, h_q, d) for _, lengths in times)
            result[f"{name}_gpu_ms_per_step"] = statistics.median(ms for ms, _ in times)
            result[f"{name}_useful_tflops"] = useful / (sum(ms for ms, _ in times) * 1e-3) / 1e12
        except Exception as error:
            result[f"{name}_error"] = short(error)
    return result


# --- decode over a paged cache -----------------------------------------------------------------

def copy_bandwidth():
    """Device memory bandwidth of a plain copy (read + write), the ceiling decode is held to."""
    x = torch.empty(2 ** 30, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    ms = cuda_median_ms(lambda: y.copy_(x), 3, 10)
    return 2 * x.numel() / (ms * 1e-3)


def decode(bench, batch, seq_kv, page, bandwidth, queries=1, beside=True):
    """One decode row. Several queries (speculative decoding) run without a mask on both sides: the
    dense PyTorch call has no bottom-right causal mask to match ours. Without `beside` (the unsplit
    child, whose fusedattn time alone is read) only fusedattn's call on a stream is timed."""
    h_q, h_kv, d = 32, 8, 128
    pages = batch * seq_kv // page
    # The dense cache doubles as the page pool (bshd pages are slices of a bshd cache), so both
    # sides read the same bytes; the page table visits the pool's pages in shuffled order.
    k = torch.rand(batch, seq_kv, h_kv, d, device="cuda", dtype=BF16)
    v = torch.rand_like(k)
    q = torch.rand(batch, queries, h_q, d, device="cuda", dtype=BF16)
    o = torch.empty_like(q)
    table_k = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(batch, seq_kv // page)
    table_v = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(batch, seq_kv // page)
    len_q = torch.full((batch,), queries, device="cuda", dtype=torch.int32)
    len_kv = torch.full((batch,), seq_kv, device="cuda", dtype=torch.int32)
    causal = queries == 1
    spec = bench.spec_string("bshd_paged_bshd", batch, queries, seq_kv, h_q, h_kv, d, causal=causal,
                             bottom_right=causal, page_size=page, pages=pages)
    bytes_read = 2 * k.numel() * k.element_size()
    row = {"b": batch, "s_q": queries, "s_kv": seq_kv, "page_size": page, "spec": spec, "kv_bytes": bytes_read}

    def ours():
        bench.enqueue_paged_forward(spec, q, k, v, o, len_q, len_kv, table_k, table_v, 1)

    def record(name, ms):
        row[f"{name}_us"], row[f"{name}_bw_fraction"] = ms * 1e3, bytes_read / (ms * 1e-3) / bandwidth
    record("fusedattn", cuda_median_ms(ours, 3, 20))
    if not beside:
        return row
    # Captured in a CUDA graph, as serving engines run a decode step: both sides, the same way.
    record("fusedattn_graph", captured_median_ms(ours, 3, 20))
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    for name, backend in (("torch_cudnn_dense", SDPBackend.CUDNN_ATTENTION),
                          ("torch_flash_dense", SDPBackend.FLASH_ATTENTION)):
        try:
            def call():
                with sdpa_kernel(backend), torch.no_grad():
                    F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
            record(name, cuda_median_ms(call, 3, 20))
            if backend == SDPBackend.CUDNN_ATTENTION:
                record(f"{name}_graph", captured_median_ms(call, 3, 20))
        except Exception as error:
            row[f"{name}_error"] = short(error)
    return row


def add_unsplit(rows, args):
    """The same decode rows timed in a process with FUSEDATTN_SPLIT_DECODE=0 (read once per process),
    each cache in one cuDNN call: the split's gain, beside it."""
    with tempfile.TemporaryDirectory() as folder:
        child = subprocess.run([sys.executable, __file__, "--build", args.build, "--out", folder, "--name", "unsplit",
                                "--decode-only", "--max-cache-gb", str(args.max_cache_gb)],
                               env=dict(os.environ, FUSEDATTN_SPLIT_DECODE="0"), capture_output=True, text=True)
        if child.returncode != 0:
            print(f"the unsplit decode run failed:\n{child.stderr[-2000:]}", flush=True)
            return
        unsplit = {(r["b"], r.get("s_q", 1), r["s_kv"]): r
                   for r in json.loads((Path(folder) / "unsplit.json").read_text())["decode"]}
    for r in rows:
        other = unsplit.get((r["b"], r.get("s_q", 1), r["s_kv"]), {})
        for key in ("us", "bw_fraction"):
            if f"fusedattn_{key}" in other:
                r[f"fusedattn_unsplit_{key}"] = other[f"fusedattn_{key}"]


def fmt(x, form):
    return form.format(x) if isinstance(x, (int, float)) and not math.isnan(x) else "–"


def markdown(step, rows, bandwidth):
    lines = ["## Packed training step (BF16, thd, h 32/8, d 128, causal, forward+backward)", ""]
    if step:
        lines += [f"{step['steps']} steps of {step['tokens_per_step']} tokens ({step['lengths']}, median "
                  f"{step['sequences_per_step_median']} sequences a step).", "",
                  "| | fusedattn (ragged) | PyTorch cuDNN (padded) | PyTorch flash (padded) |", "|---|---|---|---|",
                  f"| TFLOP/s (useful) | {fmt(step['fusedattn_tflops'], '{:.0f}')} | "
                  f"{fmt(step.get('torch_cudnn_padded_useful_tflops'), '{:.0f}')} | "
                  f"{fmt(step.get('torch_flash_padded_useful_tflops'), '{:.0f}')} |",
                  f"| GPU ms per step | {fmt(step['fusedattn_gpu_ms_per_step'], '{:.2f}')} | "
                  f"{fmt(step.get('torch_cudnn_padded_gpu_ms_per_step'), '{:.2f}')} | "
                  f"{fmt(step.get('torch_flash_padded_gpu_ms_per_step'), '{:.2f}')} |",
                  f"| host µs per step (enqueue) | {fmt(step['fusedattn_host_us_per_step'], '{:.1f}')} | | |",
                  f"| plan builds, first / second pass | {step['plan_builds_first_pass']} / "
                  f"{step['plan_builds_second_pass']} | | |", ""]
    lines += [f"## Decode over a paged cache (BF16, h 32/8, d 128, 64-token pages), fraction of "
              f"{bandwidth / 1e12:.2f} TB/s (copy bandwidth measured in this run); one query causal, several "
              "without a mask; unsplit: FUSEDATTN_SPLIT_DECODE=0 in a process of its own", "",
              "", "Each call timed back to back on a stream; \"graph\": the same call captured in a CUDA graph and "
              "replayed back to back, as serving engines run a decode step (PyTorch's cuDNN call captured the same way).",
              "",
              "| b | s_q | s_kv | fusedattn paged µs (fraction) | graph | unsplit | PyTorch cuDNN dense | graph | "
              "PyTorch flash dense |",
              "|---|---|---|---|---|---|---|---|---|"]

    def cell(r, name):
        us, fraction = r.get(f"{name}_us"), r.get(f"{name}_bw_fraction")
        return f"{fmt(us, '{:.1f}')} ({fmt(fraction, '{:.2f}')})" if us is not None else "–"
    for r in rows:
        cells = [cell(r, name) for name in ("fusedattn", "fusedattn_graph", "fusedattn_unsplit", "torch_cudnn_dense",
                                            "torch_cudnn_dense_graph", "torch_flash_dense")]
        lines.append(f"| {r['b']} | {r.get('s_q', 1)} | {r['s_kv']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build", help="the build folder (FUSEDATTN_PYTHON=ON); default: build")
    parser.add_argument("--out", default="results", help="folder of the results (default: results)")
    parser.add_argument("--name", default="bench-varlen", help="file stem, overwritten each run")
    parser.add_argument("--tokens", type=int, default=32768, help="tokens per packed training step")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--max-cache-gb", type=float, default=40.0, help="skip decode rows whose K+V exceed this")
    parser.add_argument("--decode-only", action="store_true", help="only the decode rows, fusedattn alone (the unsplit child)")
    parser.add_argument("--no-unsplit", action="store_true", help="do not time the unsplit decode beside")
    parser.add_argument("--no-step", action="store_true", help="leave the packed training step out (decode rows only, "
                        "the unsplit decode still beside)")
    args = parser.parse_args()
    bench = Bench(load(args.build)[0])
    info = bench.build_info()
    print(f"{info}\nPyTorch {torch.__version__}, its cuDNN {torch.backends.cudnn.version()}\n", flush=True)
    failures, step = [], None
    if not args.decode_only and not args.no_step:
        try:
            step = training_step(bench, args)
        except Exception as error:
            failures.append({"what": "training step", "error": short(error)})
    bandwidth = copy_bandwidth()
    rows = []
    points = [(batch, 1, seq_kv) for batch in (1, 8, 64, 128) for seq_kv in (2048, 8192, 32768, 131072)]
    points += [(4, queries, 8192) for queries in (8, 16)] + [(1, 16, 32768)]
    for batch, queries, seq_kv in points:
        gb = 2 * batch * seq_kv * 8 * 128 * 2 / 1e9
        if gb > args.max_cache_gb:
            rows.append({"b": batch, "s_q": queries, "s_kv": seq_kv, "skipped": f"K+V {gb:.0f} GB > --max-cache-gb"})
            continue
        print(f"decode b={batch} s_q={queries} s_kv={seq_kv} ...", flush=True)
        try:
            rows.append(decode(bench, batch, seq_kv, 64, bandwidth, queries, beside=not args.decode_only))
            torch.cuda.empty_cache()  # the next cache may be larger: hand this one's memory back
        except Exception as error:
            failures.append({"what": f"decode b={batch} s_q={queries} s_kv={seq_kv}", "error": short(error)})
    if not args.decode_only and not args.no_unsplit:
        add_unsplit(rows, args)
    gpu = torch.cuda.get_device_name()
    name = args.name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "build_info": info, "gpu": gpu,
              "torch": torch.__version__, "argv": sys.argv, "copy_bandwidth_bytes_per_s": bandwidth,
              "training_step": step, "decode": rows, "plan_cache": bench.cache_stats(), "failures": failures}
    (out / f"{name}.json").write_text(json.dumps(record, indent=2))
    (out / f"{name}.md").write_text(markdown(step, [r for r in rows if "skipped" not in r], bandwidth) + "\n")
    print(f"wrote {out / name}.json, .md")
    for failure in failures:
        print(f"FAILED {failure['what']}: {failure['error']}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
