"""bench/host_calls.py — where a step's wall time goes when its kernels do not fill it: the CUDA
runtime calls the host makes in one step (launches, graph captures and instantiations, allocations,
synchronizations), from torch.profiler, beside the step's wall time and its kernels' GPU time. For
the diagnostics, not the benchmarks."""
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from harness import host_us


def runtime_calls(step, steps=5):
    """(wall ms a step, kernel ms a step, [(CUDA runtime call, calls a step, host µs a step)], most
    host time first) of `step` after harness.host_us's warm-up."""
    wall_ms = host_us(step, steps, until_done=True) / 1e3  # warmed up there
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    calls, kernel_us = collections.defaultdict(lambda: [0, 0.0]), 0.0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernel_us += event.device_time_total
        elif event.name.startswith("cuda"):
            calls[event.name][0] += 1
            calls[event.name][1] += event.cpu_time_total
    listed = [(name, count / steps, us / steps) for name, (count, us) in calls.items()]
    return wall_ms, kernel_us / 1e3 / steps, sorted(listed, key=lambda row: -row[2])
