#!/usr/bin/env python3
"""Where a flex_attention training step of bench/run_bench_flex.py's cases spends its host time:
for each named case, fusedattn.torch.flex_attention's forward + backward timed as an eager loop
(host time alone, and until the GPU is done), its kernels' GPU time, then the same step under
cProfile (the host's Python functions by their own time). Run it with FUSEDATTN_REPLAY=0 beside the
default to see what replaying recorded calls saves or costs. A diagnostic, not a benchmark.

    python bench/profile_flex_step.py --build build --cases "prefix-LM 256;32 documents, causal"
"""
import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import host_us, kernel_times  # noqa: E402
from run_bench_flex import cases  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--cases", default="causal;prefix-LM 256", help="names from run_bench_flex.cases, by ';'")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--functions", type=int, default=22, help="rows of the host's table")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.build) / "python"))
    import fusedattn.torch as fa
    from fusedattn.torch import _flex_run, _score_mod
    from torch.nn.attention.flex_attention import create_block_mask

    wanted = [name.strip() for name in args.cases.split(";")]
    for name, b, h, s, mask_mod, score_mod in cases():
        if name not in wanted:
            continue

        def make():
            return (torch.rand(b, h, s, 128, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()

        q, k, v = make(), make(), make()
        d_o = torch.rand(b, h, s, 128, device="cuda", dtype=torch.bfloat16)
        block_mask = create_block_mask(mask_mod, None, None, s, s, device="cuda")
        forward = lambda: fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)  # noqa: E731
        profile_step(name, (b, h, s), forward, d_o, args)
        structure = _score_mod.mask_structure(mask_mod)
        if structure is not None and structure[0] == "prefix":  # its other road, as compiled code takes it
            def by_calls():
                return _flex_run._prefix_by_calls(structure[1], q, k, v, score_mod, _flex_run._scale(q, None), False,
                                                  fa.attention)
            profile_step(name + " by two attention() calls", (b, h, s), by_calls, d_o, args)


def profile_step(name, shape, forward, d_o, args):
    """One case's step timed, its kernels, and its Python functions under cProfile, printed."""
    def step():
        forward().backward(d_o)

    host = host_us(step, args.steps) / 1e3
    wall = host_us(step, args.steps, until_done=True) / 1e3
    with torch.no_grad():
        host_fwd = host_us(forward, args.steps) / 1e3
    kernels = kernel_times(step, steps=5)
    gpu = sum(ms for _, _, ms in kernels)
    print(f"\n## {name} ({shape[0]}, {shape[1]}, {shape[2]}, 128): a step {wall:.3f} ms, host {host:.3f} ms "
          f"(forward alone {host_fwd:.3f}), kernels {gpu:.3f} ms")
    for kernel, launches, ms in kernels[:12]:
        print(f"{ms:9.3f} {launches:6d}  {kernel[:100]}")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.steps):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.functions)
    print(f"\n### host: Python functions by own time ({args.steps} steps)\n")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:5000])


if __name__ == "__main__":
    main()
