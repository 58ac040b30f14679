#!/usr/bin/env python3
"""Where fusedattn.torch's host time goes: cProfile of eager inference and training calls at the
host-overhead shape (1, 128, 8, 64, causal, BF16), top entries by own time. A diagnostic for the
adapter's per-call cost, not a benchmark (the profiler itself slows every Python call).

    FUSEDATTN_PYTHON_BUILD=build/python python bench/profile_torch_call.py
"""
import cProfile
import os
import pstats
import sys

import torch

sys.path.insert(0, os.environ.get("FUSEDATTN_PYTHON_BUILD", "build/python"))
import fusedattn.torch as fa  # noqa: E402

q, k, v = (torch.rand(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
d_o = torch.rand_like(q)


def inference(calls):
    with torch.no_grad():
        for _ in range(calls):
            fa.attention(q, k, v, causal=True)


def training(calls):
    for _ in range(calls):
        fa.attention(q, k, v, causal=True).backward(d_o)


for name, loop in (("inference", inference), ("training", training)):
    loop(100)
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.runcall(loop, 2000)
    torch.cuda.synchronize()
    print(f"--- {name}: 2000 calls")
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)
