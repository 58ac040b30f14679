#!/usr/bin/env python3
"""Where a tiny training step's host time goes, piece by piece, for fusedattn.torch and PyTorch SDPA
(cuDNN backend) in one process: the forward alone, the backward alone (one forward, then the
backward run again and again on it), the backward through the autograd engine's own entry point
(what torch.autograd.backward adds in Python is the difference), and floors that any PyTorch
op pays: an allocation, a one-kernel op forward and backward on the GPU, and the same on the CPU,
where the engine runs the backward on the calling thread instead of handing it to its GPU
thread. A diagnostic beside host_overhead.py's table, at the same shape and with the same timer.

    python bench/host_breakdown.py --build build [--out results]   # --out: writes DIR/bench-host-breakdown.md
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Tensors, host_us, load  # noqa: E402
from host_overhead import TINY  # noqa: E402

run_backward = torch.autograd.Variable._execution_engine.run_backward


def backward_loop(out, grad, leaves, direct):
    """One backward of `out` per call (the graph kept), the leaves' .grad cleared first so that every
    call accumulates the same way."""
    def call():
        for leaf in leaves:
            leaf.grad = None
        if direct:  # the engine's C++ entry, skipping torch.autograd.backward's Python checks
            run_backward((out,), (grad,), True, False, (), True, True)
        else:
            torch.autograd.backward(out, grad, retain_graph=True)
    return call


def loops(adapter, t):
    leaves = [x.detach().requires_grad_() for x in (t.q, t.k, t.v)]
    ours = adapter.attention(*leaves, layout="bshd", causal=True)
    fast = adapter._fast
    config_id = adapter._plain_config_id("bshd", True, (-1, -1), "top_left", False, "vanilla", False)
    sdpa_leaves = [x.transpose(1, 2) for x in leaves]
    d_o_t = t.do.transpose(1, 2)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        theirs = F.scaled_dot_product_attention(*sdpa_leaves, is_causal=True)
    cpu = torch.rand(8, 64, requires_grad=True)
    cpu_grad = torch.rand(8, 64)
    one_kernel = leaves[0] * 2
    one_kernel_cpu = cpu * 2
    cudnn = lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)  # noqa: E731
    return {
        # name: (call, context its loop runs in)
        "allocation: torch.empty of O's shape": (lambda: torch.empty_like(t.q), torch.no_grad),
        "fusedattn._torch_ops.forward, inference (C++ only)": (lambda: fast.forward(t.q, t.k, t.v, config_id, None),
                                                              torch.no_grad),
        "fusedattn.torch.attention, inference": (lambda: adapter.attention(t.q, t.k, t.v, causal=True), torch.no_grad),
        "fusedattn._torch_ops.forward, training (C++ only)": (lambda: fast.forward(*leaves, config_id, None),
                                                             torch.enable_grad),
        "fusedattn.torch.attention, training forward": (lambda: adapter.attention(*leaves, causal=True),
                                                        torch.enable_grad),
        "fusedattn backward alone (torch.autograd.backward)": (backward_loop(ours, t.do, leaves, False),
                                                               torch.enable_grad),
        "fusedattn backward alone (engine entry)": (backward_loop(ours, t.do, leaves, True), torch.enable_grad),
        "PyTorch cuDNN SDPA, training forward": (lambda: F.scaled_dot_product_attention(*sdpa_leaves, is_causal=True),
                                                 cudnn),
        "PyTorch cuDNN SDPA backward alone (torch.autograd.backward)": (
            backward_loop(theirs, d_o_t, leaves, False), cudnn),
        "PyTorch cuDNN SDPA backward alone (engine entry)": (backward_loop(theirs, d_o_t, leaves, True), cudnn),
        "floor, GPU: x * 2 forward (one kernel)": (lambda: leaves[0] * 2, torch.enable_grad),
        "floor, GPU: its backward alone (engine entry)": (backward_loop(one_kernel, t.q, leaves[:1], True),
                                                          torch.enable_grad),
        "floor, CPU: its backward alone (engine entry, no hand-off)": (
            backward_loop(one_kernel_cpu, cpu_grad, [cpu], True), torch.enable_grad),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default=None)
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    _, adapter = load(args.build)
    t = Tensors(TINY)
    table = loops(adapter, t)
    samples = {name: [] for name in table}
    for _ in range(args.rounds):  # interleaved, as in host_overhead.py, so drift touches all alike
        for name, (call, context) in table.items():
            with context():
                samples[name].append(host_us(call, args.calls))
    lines = [f"| host µs per call, {TINY.key}, BF16 (median of {args.rounds} interleaved rounds of {args.calls}) | µs |",
             "|---|---|"]
    lines += [f"| {name} | {statistics.median(values):.2f} |" for name, values in samples.items()]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out, "bench-host-breakdown.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
