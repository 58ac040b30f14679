#!/usr/bin/env python3
"""bench/run_bench_flex.py — fusedattn.torch.flex_attention beside compiled FlexAttention with its
block mask, in one process on the same [b, h, s, d] tensors, forward and forward+backward: the masks
FlexAttention's users write (prefix-LM, documents, a sliding window with a softcap, T5's bucketed
bias, and plain causal for scale). Writes JSON and markdown.

    python bench/run_bench_flex.py --build build   # writes results/bench-flex.*
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from flex_masks import documents, t5_bucket
from harness import forward_and_training_ms, kernel_times, short, write_results
from host_calls import runtime_calls

PROFILED = ("causal", "prefix-LM 256", "T5 bias, causal")  # where it lost, and plain causal beside: each step listed


def cases():
    """(name, b, h, s, mask_mod, score_mod) of each row."""
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    softcap = lambda score, b, h, q, kv: 30.0 * torch.tanh(score / 30.0)  # noqa: E731
    out = [("causal", 2, 16, 2048, causal, None),
           ("prefix-LM 256", 2, 16, 2048, lambda b, h, q, kv: (q >= kv) | (kv < 256), None),
           ("window 1024 + softcap", 2, 16, 8192, lambda b, h, q, kv: (q >= kv) & (q - kv < 1024), softcap)]
    for count in (8, 32):
        doc = documents(8192, count)
        out.append((f"{count} documents", 1, 16, 8192, lambda b, h, q, kv, doc=doc: doc[q] == doc[kv], None))
        out.append((f"{count} documents, causal", 1, 16, 8192,
                    lambda b, h, q, kv, doc=doc: (doc[q] == doc[kv]) & (q >= kv), None))
    table = torch.randn(32, 16, device="cuda")
    out.append(("T5 bias, causal", 2, 16, 2048, causal,
                lambda score, b, h, q, kv: score + table[t5_bucket(kv - q), h]))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="results", help="folder of the results (default: results)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.build) / "python"))
    import fusedattn.torch as fa
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    rows, profiles = [], []
    for name, b, h, s, mask_mod, score_mod in cases():
        # A fresh compile per case, as a model compiles its own: one compiled function across
        # cases recompiles for each new mask and score_mod, and past Dynamo's recompile limit runs
        # FlexAttention uncompiled (36 ms where compiled it takes 0.3).
        torch._dynamo.reset()
        theirs = torch.compile(flex_attention, dynamic=False)
        make = lambda: (torch.rand(b, h, s, 128, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
        q, k, v = make(), make(), make()
        d_o = torch.rand(b, h, s, 128, device="cuda", dtype=torch.bfloat16)
        block_mask = create_block_mask(mask_mod, None, None, s, s, device="cuda")
        calls = {"fusedattn": lambda: fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask),
                 "FlexAttention": lambda: theirs(q, k, v, score_mod=score_mod, block_mask=block_mask)}
        ms = forward_and_training_ms(calls, {who: d_o for who in calls}, rounds=args.rounds, warmup=args.warmup,
                                     iters=args.iters)
        for p, pass_name in enumerate(("fwd", "fwd+bwd")):
            row = {"case": name, "shape": f"{b},{h},{s},128", "pass": pass_name}
            for who in calls:
                row[who] = ms[(who, p)]
            if all(isinstance(row[who], float) for who in calls):
                row["speedup"] = row["FlexAttention"] / row["fusedattn"]
            rows.append(row)
            print(json.dumps(row), flush=True)
        if name in PROFILED:
            profiles.append(profile(name, calls["fusedattn"], d_o))
    lines = ["| case | b, h, s, d | pass | fusedattn ms | FlexAttention ms | fusedattn speedup |",
             "|---|---|---|---|---|---|"]
    cell = lambda x: f"{x:.3f}" if isinstance(x, float) else x  # noqa: E731
    for r in rows:
        speedup = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        lines.append(f"| {r['case']} | {r['shape']} | {r['pass']} | {cell(r['fusedattn'])} | "
                     f"{cell(r['FlexAttention'])} | {speedup} |")
    for name, kernels, host in profiles:
        lines += ["", f"fusedattn's kernels in one forward + backward of {name} (torch.profiler):", "",
                  "| kernel | launches | ms |", "|---|---|---|"]
        lines += [f"| {kernel[:90]} | {count} | {ms:.3f} |" for kernel, count, ms in kernels] if isinstance(
            kernels, list) else [f"| {kernels} | | |"]
        if isinstance(host, tuple):
            wall, kernel_ms, runtime = host
            lines += ["", f"The host's CUDA runtime calls in one forward + backward of {name}: {wall:.3f} ms of wall "
                          f"time a step, {kernel_ms:.3f} ms of kernels:", "",
                      "| runtime call | calls | host µs |", "|---|---|---|"]
            lines += [f"| {call} | {count:g} | {us:.1f} |" for call, count, us in runtime[:12]]
        else:
            lines += ["", f"The host's CUDA runtime calls of {name}: {host}"]
    # One file name, overwritten each run.
    record = {"gpu": torch.cuda.get_device_name(), "rows": rows,
              "kernels": {name: kernels for name, kernels, _ in profiles},
              "host": {name: host for name, _, host in profiles}}
    write_results(args.out, "bench-flex", record, lines)


def profile(name, call, d_o):
    """(name, the kernels of one forward + backward of `call`: (kernel, launches, ms), and the host's
    CUDA runtime calls: host_calls.runtime_calls), each or its error."""
    def step():
        with torch.enable_grad():
            call().backward(d_o)
    found = []
    for diagnosis in (kernel_times, runtime_calls):
        try:
            found.append(diagnosis(step))
        except Exception as error:  # noqa: BLE001 - the timings above stand without it
            found.append(short(error))
    return (name, *found)


if __name__ == "__main__":
    main()
