#!/usr/bin/env python3
"""bench/run_bench_score_mod.py — a softcap score modifier (30·tanh(x/30), FlexAttention's example)
through fusedattn.torch beside compiled FlexAttention with the same function and beside
fusedattn.torch's plain attention, in one process on the same tensors; writes JSON and markdown.

    python bench/run_bench_score_mod.py --build build   # writes results/bench-score-mod.*

TFLOP/s as ANCHORS.md counts them (forward 4·b·h·s²·d, halved when causal; forward+backward 3.5x),
the modifier's work not counted.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from harness import forward_and_training_ms, write_results

SHAPES = [(2, 8192, 16, 128, True), (2, 8192, 16, 128, False)]


def softcap(score, b, h, q_idx, kv_idx):
    return 30.0 * torch.tanh(score / 30.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="results", help="folder of the results (default: results)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--causal-only", action="store_true", help="the causal shape alone")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.build) / "python"))
    import fusedattn.torch as fa
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention)
    rows = []
    for b, s, h, d, causal in [shape for shape in SHAPES if shape[4] or not args.causal_only]:
        make = lambda: (torch.rand(b, s, h, d, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
        q, k, v = make(), make(), make()
        d_o = torch.rand(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        # FlexAttention takes [b, h, s, d]: the same tensors, transposed views.
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        mask = create_block_mask(lambda b_, h_, q_, kv_: q_ >= kv_, None, None, s, s) if causal else None
        calls = {
            "fusedattn softcap": lambda: fa.attention(q, k, v, causal=causal, score_mod=softcap),
            "fusedattn plain": lambda: fa.attention(q, k, v, causal=causal),
            "FlexAttention softcap": lambda: flex(qt, kt, vt, score_mod=softcap, block_mask=mask),
        }
        grads = {"fusedattn softcap": d_o, "fusedattn plain": d_o, "FlexAttention softcap": d_o.transpose(1, 2)}
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        ms = forward_and_training_ms(calls, grads, rounds=args.rounds, warmup=args.warmup, iters=args.iters)
        for p, pass_name in enumerate(("fwd", "fwd+bwd")):
            row = {"shape": f"{b},{s},{h},{d}" + (",causal" if causal else ""), "pass": pass_name}
            for name in calls:
                best = ms[(name, p)]
                if isinstance(best, str):
                    row[name] = best
                else:
                    row[name] = {"ms": best, "tflops": flops * (3.5 if p else 1) / (best * 1e-3) / 1e12}
            ours, plain, theirs = row["fusedattn softcap"], row["fusedattn plain"], row["FlexAttention softcap"]
            if all(isinstance(x, dict) for x in (ours, plain, theirs)):
                row["softcap / Flex"] = theirs["ms"] / ours["ms"]
                row["softcap / plain"] = plain["ms"] / ours["ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = ["| shape | pass | fusedattn softcap | fusedattn plain | FlexAttention softcap | vs Flex | vs plain |",
             "|---|---|---|---|---|---|---|"]
    cell = lambda x: f"{x['ms']:.3f} ms, {x['tflops']:.0f}" if isinstance(x, dict) else x
    for r in rows:
        lines.append(f"| {r['shape']} | {r['pass']} | {cell(r['fusedattn softcap'])} | {cell(r['fusedattn plain'])} | "
                     f"{cell(r['FlexAttention softcap'])} | {r.get('softcap / Flex', 0):.2f} | "
                     f"{r.get('softcap / plain', 0):.2f} |")
    # One file name, overwritten each run.
    write_results(args.out, "bench-score-mod", {"gpu": torch.cuda.get_device_name(), "rows": rows}, lines)


if __name__ == "__main__":
    main()
