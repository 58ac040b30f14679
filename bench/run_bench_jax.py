#!/usr/bin/env python3
"""bench/run_bench_jax.py — fusedattn.jax against jax.nn.dot_product_attention(implementation="cudnn")
under jit, in one process, on the same arrays, timed the same way; writes JSON
and a markdown table.

    python bench/run_bench_jax.py [--shapes 2,8192,16,128,causal] [--rounds 5]   # writes results/bench-jax.*

Timing: each implementation's jitted function is called `iters` times back to back and blocked
on once, host clock around the loop: with async dispatch the GPU runs the calls back to back, so
at these sizes this is GPU time (ANCHORS.md measured JAX the same way). Rounds interleave the
implementations; the median over rounds is reported. Forward: O only (inference). Forward and
backward: O and dQ, dK, dV for a given dO (jax.vjp), the usual 3.5 x forward FLOPs.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

TARGET = 0.98  # fusedattn.jax / JAX's cuDNN implementation (the same cuDNN kernels)
SHAPES = ["2,8192,16,128", "2,8192,16,128,causal", "8,2048,32,128,causal", "1,32768,32/8,128,causal",
          "4,4096,16,64"]
IMPLS = ["fusedattn_jax", "jax_cudnn"]


def parse_shape(key):
    parts = key.split(",")
    b, s, heads, d = int(parts[0]), int(parts[1]), parts[2], int(parts[3])
    h_q, h_kv = (int(x) for x in heads.split("/")) if "/" in heads else (int(heads), int(heads))
    return dict(key=key, b=b, s=s, h_q=h_q, h_kv=h_kv, d=d, causal=parts[-1] == "causal")


def fwd_flops(shape):  # ANCHORS.md: 4·b·h·s_q·s_kv·d, halved when causal
    return 4.0 * shape["b"] * shape["h_q"] * shape["s"] ** 2 * shape["d"] / (2 if shape["causal"] else 1)


def attention_fn(impl, causal):
    if impl == "fusedattn_jax":
        import fusedattn.jax as fj
        return lambda q, k, v: fj.attention(q, k, v, causal=causal)
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")


def jitted(impl, causal, backward):
    attend = attention_fn(impl, causal)
    if not backward:
        return jax.jit(attend)

    def step(q, k, v, d_o):
        out, pullback = jax.vjp(attend, q, k, v)
        return (out, *pullback(d_o))
    return jax.jit(step)


def timed_ms(fn, args, iters):
    out = fn(*args)
    jax.block_until_ready(out)
    start = time.perf_counter()
    for _ in range(iters):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) * 1e3 / iters


def relative_error(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def bench_shape(shape, rounds, notes):
    keys = jax.random.split(jax.random.key(0), 4)
    b, s, d = shape["b"], shape["s"], shape["d"]
    q = jax.random.uniform(keys[0], (b, s, shape["h_q"], d), jnp.float32, -1, 1).astype(jnp.bfloat16)
    k = jax.random.uniform(keys[1], (b, s, shape["h_kv"], d), jnp.float32, -1, 1).astype(jnp.bfloat16)
    v = jax.random.uniform(keys[2], (b, s, shape["h_kv"], d), jnp.float32, -1, 1).astype(jnp.bfloat16)
    d_o = jax.random.uniform(keys[3], q.shape, jnp.float32, -1, 1).astype(jnp.bfloat16)
    rows = []
    for backward in (False, True):
        args = (q, k, v, d_o) if backward else (q, k, v)
        fns, outputs = {}, {}
        for impl in IMPLS:
            try:
                fns[impl] = jitted(impl, shape["causal"], backward)
                outputs[impl] = jax.block_until_ready(fns[impl](*args))
            except Exception as error:  # an implementation that refuses the shape gets a dash
                notes.append(f"{impl} {shape['key']} {'fwd+bwd' if backward else 'fwd'}: "
                             f"{type(error).__name__}: {str(error).splitlines()[0][:200]}")
                fns.pop(impl, None)
        iters = max(3, min(50, int(2e13 / (fwd_flops(shape) * (3.5 if backward else 1)))))
        times = {impl: [] for impl in fns}
        for _ in range(rounds):
            for impl, fn in fns.items():
                times[impl].append(timed_ms(fn, args, iters))
        flops = fwd_flops(shape) * (3.5 if backward else 1)
        row = dict(shape=shape["key"], pass_="fwd+bwd" if backward else "fwd", iters=iters,
                   ms={impl: statistics.median(t) for impl, t in times.items()})
        row["tflops"] = {impl: flops / (ms * 1e-3) / 1e12 for impl, ms in row["ms"].items()}
        if "fusedattn_jax" in outputs and "jax_cudnn" in outputs:
            ours, theirs = outputs["fusedattn_jax"], outputs["jax_cudnn"]
            ours, theirs = (ours, theirs) if backward else ((ours,), (theirs,))
            row["rel_error_vs_jax_cudnn"] = [relative_error(a, b) for a, b in zip(ours, theirs)]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(rows, notes):
    def cell(row, impl):
        value = row["tflops"].get(impl)
        return "–" if value is None else f"{value:.1f}"
    lines = ["| shape (b, s, h_q[/h_kv], d) | pass | fusedattn.jax | JAX cuDNN | "
             f"fusedattn.jax / JAX cuDNN (target ≥ {TARGET}) |", "|---|---|---|---|---|"]
    for row in rows:
        ours, theirs = row["tflops"].get("fusedattn_jax"), row["tflops"].get("jax_cudnn")
        ratio = "–" if not (ours and theirs) else f"{ours / theirs:.3f} {'✓' if ours / theirs >= TARGET else '✗'}"
        lines.append(f"| {row['shape']} | {row['pass_']} | {cell(row, 'fusedattn_jax')} | {cell(row, 'jax_cudnn')} | "
                     f"{ratio} |")
    lines += ["", "TFLOP/s, BF16, bshd, under jax.jit; median over interleaved rounds of back-to-back calls "
              "(host clock around a blocked loop).", ""]
    lines += ["Relative L2 difference of fusedattn.jax from JAX's cuDNN implementation (O; O, dQ, dK, dV):", ""]
    lines += [f"- {row['shape']} {row['pass_']}: "
              + ", ".join(f"{e:.1e}" for e in row.get("rel_error_vs_jax_cudnn", [])) for row in rows]
    if notes:
        lines += ["", "Not measured:", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results", help="folder of the results (default: results)")
    parser.add_argument("--shapes", nargs="*", default=SHAPES)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    build = os.environ.get("FUSEDATTN_PYTHON_BUILD")
    if build:
        sys.path.insert(0, build)
    gpu = jax.devices()[0]
    if gpu.platform != "gpu":
        sys.exit("run_bench_jax.py needs a GPU visible to JAX")
    notes, rows = [], []
    for key in args.shapes:
        rows += bench_shape(parse_shape(key), args.rounds, notes)
    stem = "bench-jax"  # one name, overwritten each run
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(jax=jax.__version__, device=gpu.device_kind, rounds=args.rounds)
    (out / f"{stem}.json").write_text(json.dumps(dict(meta=meta, rows=rows, notes=notes), indent=1))
    table = markdown(rows, notes)
    (out / f"{stem}.md").write_text(table)
    print(table)
    ok = all(row["tflops"].get("fusedattn_jax", 0) >= TARGET * row["tflops"].get("jax_cudnn", float("inf"))
             for row in rows if "jax_cudnn" in row["tflops"])
    print("target met" if ok else "target NOT met on some rows")


if __name__ == "__main__":
    main()
