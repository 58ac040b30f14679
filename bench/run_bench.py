#!/usr/bin/env python3
"""bench/run_bench.py — fusedattn against PyTorch SDPA (cuDNN and flash backends) in one process,
on the same tensors, timed the same way; writes JSON, a markdown table and a bar chart.

    python bench/run_bench.py --build build [--shapes 2,8192,16,128,causal]   # writes results/bench-attention.*

The build must be configured with FUSEDATTN_PYTHON=ON: its python/ folder then holds the package
and fusedattn_bench, the module that times fusedattn's C++ API (bench/bench_module.cpp). The host
section (bench/host_overhead.py) follows the throughput rows; `--shapes none` runs it alone.
"""
import argparse
import datetime
import json
import math
import statistics
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import host_overhead
from harness import BACKENDS, AdapterCall, Bench, Shape, Tensors, TorchSdpa, cuda_median_ms, load, short

TARGET = 0.98  # fusedattn / PyTorch-cuDNN throughput: the same cuDNN kernels run (DESIGN.md §9)
TUNED_TARGET = 1.03  # autotuned fusedattn / PyTorch-cuDNN wherever autotune picks another plan (issue 16)
# fusedattn through its C++ API (fusedattn_bench) with the heuristics' plans and with autotuned
# ones, through its PyTorch adapter, then PyTorch's own.
IMPLS = ["fusedattn", "fusedattn_tuned", "fusedattn_torch", *BACKENDS]

# ANCHORS.md's five, then many short sequences and grouped heads 64/8.
SHAPES = [Shape(2, 8192, 16, 16, 128, False), Shape(2, 8192, 16, 16, 128, True),
          Shape(8, 2048, 32, 32, 128, True), Shape(1, 32768, 32, 8, 128, True),
          Shape(4, 4096, 16, 16, 64, False), Shape(16, 1024, 16, 16, 128, True),
          Shape(1, 8192, 64, 8, 128, True)]


def make_timers(bench, adapter, spec, t, errors, notes):
    """(forward, forward+backward) timers per implementation, each called with (warmup, iters)."""
    def tuned(fn):
        def timed(w, n):
            with bench.tuned():
                return fn(spec, t, w, n)
        return timed
    fns = {"fusedattn": (lambda w, n: bench.forward_ms(spec, t, w, n),
                         lambda w, n: bench.forward_backward_ms(spec, t, w, n)),
           "fusedattn_tuned": (tuned(bench.forward_ms), tuned(bench.forward_backward_ms))}
    if adapter is None:
        errors[("fusedattn_torch", 0)] = errors[("fusedattn_torch", 1)] = "fusedattn.torch not importable"
    else:
        ours = AdapterCall(adapter, t)
        fns["fusedattn_torch"] = (lambda w, n: cuda_median_ms(ours.forward, w, n),
                                  lambda w, n: cuda_median_ms(ours.forward_backward, w, n))
    for name, backend in BACKENDS.items():
        sdpa = TorchSdpa(t, backend)
        try:
            sdpa.probe()
        except Exception as error:  # one backend failing must not hide the others
            errors[(name, 0)] = errors[(name, 1)] = short(error)
            continue
        notes[name] = sdpa.note
        fns[name] = (lambda w, n, s=sdpa: cuda_median_ms(s.forward, w, n),
                     lambda w, n, s=sdpa: cuda_median_ms(s.forward_backward, w, n))
    return fns


def bench_shape(bench, adapter, shape, args):
    """Rows for forward and forward+backward. Implementations take turns round by round, so clock
    and thermal drift hit them alike, in the reverse order every other round, so that none always
    runs first or right after another; each value is the median over rounds."""
    spec, t = bench.make_spec(shape), Tensors(shape)
    samples, errors, notes = {}, {}, {}
    fns = make_timers(bench, adapter, spec, t, errors, notes)
    turns = list(fns.items())
    for round_number in range(args.rounds):
        for name, pair in turns if round_number % 2 == 0 else reversed(turns):
            for p, fn in enumerate(pair):
                if (name, p) not in errors:
                    try:
                        samples.setdefault((name, p), []).append(fn(args.warmup, args.iters))
                    except Exception as error:
                        errors[(name, p)] = short(error)
    cli = Path(args.build) / "fusedattn"
    rows = []
    for p, pass_name in enumerate(("fwd", "fwd+bwd")):
        flops = shape.fwd_flops() * (3.5 if p else 1.0)
        row = {"shape": shape.key, "pass": pass_name, "spec": spec,
               "command": f"python bench/run_bench.py --build {args.build} --shapes {shape.key}",
               "fusedattn_command": f'{cli} bench "{spec}" --iters {args.iters}'}
        for name in IMPLS:
            ms = statistics.median(samples[(name, p)]) if samples.get((name, p)) else None
            row[f"{name}_ms"], row[f"{name}_tflops"] = ms, (flops / (ms * 1e-3) / 1e12 if ms else None)
            if (name, p) in errors:
                row[f"{name}_error"] = errors[(name, p)]
            if notes.get(name):
                row[f"{name}_note"] = notes[name]
        ours, theirs, through_torch = row["fusedattn_tflops"], row["torch_cudnn_tflops"], row["fusedattn_torch_tflops"]
        row["ratio_vs_cudnn"] = ours / theirs if ours and theirs else None
        row["torch_adapter_ratio_vs_cudnn"] = through_torch / theirs if through_torch and theirs else None
        row["meets_target"] = bool(row["ratio_vs_cudnn"] and row["ratio_vs_cudnn"] >= TARGET)
        tuned = row["fusedattn_tuned_tflops"]
        row["tuned_ratio_vs_cudnn"] = tuned / theirs if tuned and theirs else None
        rows.append(row)
    rows[0].update(bench.plan_build_ms(spec))  # rebuilt from a cleared cache, after the timings
    return rows


def relative_error(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def sanity(bench, shape):
    """fusedattn's O and gradients against PyTorch's cuDNN backend and a float32 math reference."""
    spec, t = bench.make_spec(shape), Tensors(shape)
    bench.enqueue_forward_backward(spec, t, 1)
    torch.cuda.synchronize()
    ours = {"O": t.o, "dQ": t.dq, "dK": t.dk, "dV": t.dv}
    out = {"shape": shape.key, "spec": spec}
    for name, backend, dtype in (("torch_cudnn", SDPBackend.CUDNN_ATTENTION, torch.bfloat16),
                                 ("math_f32", SDPBackend.MATH, torch.float32)):
        try:
            leaves = [x.detach().to(dtype).requires_grad_() for x in (t.q, t.k, t.v)]
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in leaves), is_causal=shape.causal,
                                                   enable_gqa=shape.h_q != shape.h_kv)
            o.backward(t.do.to(dtype).transpose(1, 2))
            theirs = {"O": o.transpose(1, 2), "dQ": leaves[0].grad, "dK": leaves[1].grad, "dV": leaves[2].grad}
            out[f"vs_{name}"] = {key: relative_error(ours[key], theirs[key]) for key in ours}
        except Exception as error:
            out[f"vs_{name}"] = short(error)
    return out


def fmt(x, form="{:.1f}"):
    return form.format(x) if isinstance(x, (int, float)) and not math.isnan(x) else "–"


def markdown(rows, host, check):
    lines = [f"| shape (b, s, h_q[/h_kv], d) | pass | fusedattn | fusedattn autotuned | fusedattn.torch | PyTorch cuDNN | "
             f"PyTorch flash | fusedattn / cuDNN (target ≥ {TARGET}) | autotuned / cuDNN | fusedattn.torch / cuDNN |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = " ✓" if r["meets_target"] else " ✗"
        lines.append(f"| {r['shape']} | {r['pass']} | " + " | ".join(fmt(r[f"{n}_tflops"]) for n in IMPLS) +
                     f" | {fmt(r['ratio_vs_cudnn'], '{:.3f}')}{mark} | {fmt(r.get('tuned_ratio_vs_cudnn'), '{:.3f}')} | "
                     f"{fmt(r.get('torch_adapter_ratio_vs_cudnn'), '{:.3f}')} |")
    lines.append("\nTFLOP/s, BF16, bshd; median over interleaved rounds of medians of event-timed calls. "
                 f"Autotuned: plans timed and chosen (fusedattn/autotune.h); target ≥ {TUNED_TARGET} where it "
                 "picks another plan than the heuristics (the autotune log lines in the run's log say which).")
    builds = [r for r in rows if r.get("plan_build_fwd_ms") is not None]
    if builds:
        lines += ["", "| shape | plan build fwd / bwd (ms) | restored from disk fwd / bwd (ms) | restore / build |",
                  "|---|---|---|---|"]
        for r in builds:
            build = r["plan_build_fwd_ms"] + r["plan_build_bwd_ms"]
            restore = (r.get("plan_restore_fwd_ms") or 0) + (r.get("plan_restore_bwd_ms") or 0)
            lines.append(f"| {r['shape']} | {fmt(r['plan_build_fwd_ms'])} / {fmt(r['plan_build_bwd_ms'])} | "
                         f"{fmt(r.get('plan_restore_fwd_ms'), '{:.2f}')} / {fmt(r.get('plan_restore_bwd_ms'), '{:.2f}')} | "
                         f"{fmt(restore / build if restore else None, '{:.3f}')} |")
    if host:
        lines += host_overhead.markdown(host)
    if check:
        def errs(x):
            return ", ".join(f"{k} {v:.1e}" for k, v in x.items()) if isinstance(x, dict) else str(x)
        lines.append(f"\nSanity at {check['shape']}, relative L2 error of fusedattn: vs PyTorch cuDNN "
                     f"{errs(check.get('vs_torch_cudnn'))}; vs float32 math {errs(check.get('vs_math_f32'))}")
    return "\n".join(lines)


def chart(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(rows)), 5))
    width = 0.8 / len(IMPLS)
    for i, name in enumerate(IMPLS):
        ax.bar([x + i * width for x in range(len(rows))], [r[f"{name}_tflops"] or 0 for r in rows], width, label=name)
    ax.set_xticks([x + width for x in range(len(rows))], [f"{r['shape']}\n{r['pass']}" for r in rows], fontsize=7)
    ax.set_ylabel("TFLOP/s (BF16)")
    ax.set_title("fusedattn vs PyTorch SDPA: same tensors, one process")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def guarded(what, failures, fn, *args):
    try:
        return fn(*args)
    except Exception as error:  # report it and carry on with the rest
        traceback.print_exc()
        failures.append({"what": what, "error": f"{type(error).__name__}: {error}"})
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build", help="the build folder (FUSEDATTN_PYTHON=ON); default: build")
    parser.add_argument("--out", default="results", help="folder of the results (default: results)")
    parser.add_argument("--name", default="bench-attention", help="file stem, overwritten each run")
    parser.add_argument("--shapes", nargs="*", help="keys such as 2,8192,16,128,causal ('none': host section only)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    # Few enough that the GPU, which takes longer per call than a replayed call's enqueueing at
    # the tiny shape, never falls so far behind that enqueueing waits: the loops measure host time.
    parser.add_argument("--host-calls", type=int, default=64)
    args = parser.parse_args()

    module, adapter = load(args.build)
    bench = Bench(module)
    info = bench.build_info()
    print(f"{info}\nPyTorch {torch.__version__}, its cuDNN {torch.backends.cudnn.version()}\n", flush=True)
    shapes = [s for s in SHAPES if args.shapes is None or s.key in args.shapes]
    failures, rows = [], []
    for shape in shapes:
        print(f"shape {shape.key} ...", flush=True)
        rows += guarded(f"shape {shape.key}", failures, bench_shape, bench, adapter, shape, args) or []
    check_shape = next((s for s in shapes if s.key == "4,4096,16,64"), shapes[0] if shapes else host_overhead.TINY)
    check = guarded("sanity", failures, sanity, bench, check_shape)
    host = guarded("host overhead", failures, host_overhead.measure, bench, adapter, args.host_calls,
                   f"python bench/run_bench.py --build {args.build} --shapes none")

    gpu = torch.cuda.get_device_name()
    name = args.name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if rows:
        guarded("chart", failures, chart, rows, out / f"{name}.png")
    table = markdown(rows, host, check)
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "build_info": info, "gpu": gpu,
              "torch": torch.__version__, "torch_cudnn": torch.backends.cudnn.version(), "argv": sys.argv,
              "target_ratio": TARGET, "rows": rows, "host_overhead": host, "sanity": check,
              "plan_cache": bench.cache_stats(), "failures": failures}
    (out / f"{name}.json").write_text(json.dumps(record, indent=2))
    (out / f"{name}.md").write_text(table + "\n")
    print(f"\nwrote {out / name}.json, .md, .png")
    for failure in failures:
        print(f"FAILED {failure['what']}: {failure['error']}")
    print("\n" + table)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
