#!/usr/bin/env python3
"""Which kernels fusedattn.torch and PyTorch's cuDNN backend launch for one training step, and how
long each takes: torch.profiler over a few forward+backward steps per shape, kernels grouped by
name. A diagnostic for backward speed gaps between the two (both run cuDNN, so a gap means that
they run different plans), not a benchmark.

    FUSEDATTN_PYTHON_BUILD=build/python python bench/profile_backward_kernels.py [--shapes 16,1024,16,128,causal]

A shape ending in ",softcap" runs fusedattn.torch alone with the softcap 30·tanh(score/30) as its
score modifier (PyTorch's cuDNN backend takes none), to show the calls a modified step makes.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.environ.get("FUSEDATTN_PYTHON_BUILD", "build/python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fusedattn.torch as fa  # noqa: E402
from harness import kernel_times  # noqa: E402

DEFAULT_SHAPES = ["16,1024,16,128,causal", "1,8192,64/8,128,causal", "2,8192,16,128,causal,softcap"]


def parse(text):
    b, s, heads, d, *rest = text.split(",")
    h_q, _, h_kv = heads.partition("/")
    return int(b), int(s), int(h_q), int(h_kv or h_q), int(d), "causal" in rest, "softcap" in rest


def softcap(score, b, h, q_idx, kv_idx):
    return 30.0 * torch.tanh(score / 30.0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES)
    args = parser.parse_args()
    for text in args.shapes:
        b, s, h_q, h_kv, d, causal, capped = parse(text)
        make = lambda h: (torch.rand(b, s, h, d, device="cuda") * 2 - 1).to(torch.bfloat16).requires_grad_()  # noqa: E731
        q, k, v = make(h_q), make(h_kv), make(h_kv)
        d_o = torch.rand(b, s, h_q, d, device="cuda", dtype=torch.bfloat16)

        def ours():
            fa.attention(q, k, v, causal=causal, score_mod=softcap if capped else None).backward(d_o)

        def theirs():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=causal, enable_gqa=h_q != h_kv)
            o.transpose(1, 2).backward(d_o)

        sides = [("fusedattn.torch", ours)] + ([] if capped else [("PyTorch cuDNN", theirs)])
        for who, step in sides:
            print(f"--- {text}: {who}, per training step")
            for name, count, ms in kernel_times(step):
                print(f"  {ms:8.3f} ms  x{count}  {name[:160]}")
        q.grad = k.grad = v.grad = None


if __name__ == "__main__":
    main()
