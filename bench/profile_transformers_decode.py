#!/usr/bin/env python3
"""Where a transformers model's decode step spends its time with attn_implementation="fusedattn"
beside "sdpa" (the models of bench/run_bench_transformers.py, random weights): greedy generate() of
--new-tokens tokens after a prompt, timed; then the same call under cProfile (the host's Python
functions by their own time) and torch.profiler (the GPU's kernels by time). A diagnostic, not a
benchmark.

    python bench/profile_transformers_decode.py --build build --model gemma2 --batch 1 --prompt 512
"""
import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import kernel_times  # noqa: E402
from run_bench_transformers import build_model, generate_s  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--model", default="gemma2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--functions", type=int, default=25, help="rows of the host's table")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.build) / "python"))
    import fusedattn.transformers
    fusedattn.transformers.register()
    model = build_model(args.model).eval()
    generator = torch.Generator(device="cuda").manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt), device="cuda", generator=generator)
    steps = args.new_tokens - 1
    print(f"# {args.model}, batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens")
    for implementation in ("fusedattn", "sdpa"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            generate_s(model, ids, args.new_tokens)  # plans and caches built
            whole = min(generate_s(model, ids, args.new_tokens)[0] for _ in range(3))
            prefill = min(generate_s(model, ids, 1)[0] for _ in range(3))
            print(f"\n## {implementation}: {1e3 * (whole - prefill) / steps:.2f} ms a decode step "
                  f"({1e3 * whole:.1f} ms the call, {1e3 * prefill:.1f} ms with one token)")
            profiler = cProfile.Profile()
            profiler.enable()
            generate_s(model, ids, args.new_tokens)
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.functions)
            print("\n### host: Python functions by own time (one call)\n")
            print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])
            print("\n### GPU: kernels of one call (ms)\n")
            for name, launches, ms in kernel_times(lambda: generate_s(model, ids, args.new_tokens), steps=1)[:15]:
                print(f"{ms:9.3f} {launches:6d}  {name[:110]}")


if __name__ == "__main__":
    main()
