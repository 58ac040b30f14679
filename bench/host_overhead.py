"""bench/host_overhead.py — run_bench.py's host section: host time per call at the tiny shape
(b=1, s=128, h=8, d=64, causal, BF16), where launching is all there is to measure. In one process,
taking turns: fusedattn's C++ API (timed in C++ by fusedattn_bench), and fusedattn.torch against
PyTorch SDPA (cuDNN and flash backends) for inference, a training forward (inputs that require
grad, under grad mode) and forward + out.backward(dO); fusedattn with replay on and off.
"""
import math
import statistics

import torch

from harness import BACKENDS, AdapterCall, Shape, Tensors, TorchSdpa, gpu_us_per_call, host_us

TINY = Shape(1, 128, 8, 8, 64, True)  # ANCHORS.md's host-overhead shape
# The three kinds of PyTorch call compared, each with the grad mode its loop runs under.
KINDS = {"inference": ("", False), "training forward": ("_train_fwd", True), "forward + backward": ("_fwd_bwd", True)}


class AutogradFloor:
    """What any attention's forward + out.backward(dO) costs at least in PyTorch: one node of three
    leaves (torch.addcmul, two tiny kernels each way) through the same autograd engine, whose
    hand-off to its GPU thread and back is most of a tiny training step's host time."""

    def __init__(self, t):
        self.leaves = [x.detach().requires_grad_() for x in (t.q, t.k, t.v)]
        self.d_o = t.do

    def train_step(self):
        for leaf in self.leaves:
            leaf.grad = None
        torch.addcmul(*self.leaves).backward(self.d_o)


def python_loops(t, adapter):
    """Result key -> (call, the context its loop runs in, entered once around the loop)."""
    loops = {}
    for name, backend in BACKENDS.items():
        sdpa = TorchSdpa(t, backend)
        for call, (suffix, grad) in zip((sdpa.inference, sdpa.train_forward, sdpa.train_step), KINDS.values()):
            loops[f"{name}{suffix}_host_us"] = (call, lambda s=sdpa, g=grad: s.context(grad=g))
    loops["autograd_floor_fwd_bwd_host_us"] = (AutogradFloor(t).train_step, torch.enable_grad)
    if adapter is not None:
        ours = AdapterCall(adapter, t)
        for call, (suffix, grad) in zip((ours.inference, ours.train_forward, ours.train_step), KINDS.values()):
            loops[f"fusedattn_torch{suffix}_host_us"] = (call, torch.enable_grad if grad else torch.no_grad)
    return loops


def measure(bench, adapter, calls, command, rounds=11):
    """Every loop takes turns with the others for `rounds` rounds and reports its median, so that
    the host's drift during the run touches all of them alike (hosts here differ by up to 1.7x from
    run to run). fusedattn's loops run with replay on and off, PyTorch's once a round."""
    t = Tensors(TINY)
    spec = bench.make_spec(TINY)
    bench.forward_ms(spec, t, 5, 20)  # builds the plan
    result = {"shape": TINY.key, "spec": spec, "calls": calls, "rounds": rounds, "command": command}
    loops = python_loops(t, adapter)
    samples = {}
    for _ in range(rounds):
        for replay in (True, False):
            with bench.replay(replay) as suffix:
                for key, (fn, context) in loops.items():
                    if suffix and not key.startswith("fusedattn"):
                        continue  # PyTorch's own calls do not depend on the switch: once a round
                    name = key.replace("_host_us", f"{suffix}_host_us")
                    samples.setdefault(name, []).append(host_us(fn, calls, context))
    result.update({key: statistics.median(values) for key, values in samples.items()})
    for replay in (True, False):  # the C++ levels take turns inside fusedattn_bench, 11 rounds each
        with bench.replay(replay) as suffix:
            us = bench.host_overhead(spec, t, calls)
        # With replay off, Plan::run sends every call through cuDNN's execute: the cuDNN-only baseline.
        result.update({f"fusedattn_api{suffix}_us": us["api_us"], f"fusedattn_plan_run{suffix}_us": us["plan_run_us"],
                       f"graph_launch_floor{suffix}_us": us["graph_floor_us"]})
    for replay in (True, False):  # a replayed call's graph launch costs the GPU time too (README)
        with bench.replay(replay) as suffix:
            result[f"fusedattn_gpu{suffix}_us"] = gpu_us_per_call(lambda n: bench.enqueue_forward(spec, t, n))
    for name, backend in BACKENDS.items():
        sdpa = TorchSdpa(t, backend)
        with sdpa.context(grad=False):
            result[f"{name}_gpu_us"] = gpu_us_per_call(lambda n, s=sdpa: [s.inference() for _ in range(n)])
    # A loop that leaves the GPU more than about a millisecond behind may wait for it: a replayed
    # call enqueues faster than the GPU runs this tiny problem.
    gpu = result["fusedattn_gpu_us"]
    result["throttled"] = calls * gpu > 1000 and result["fusedattn_api_us"] >= 0.85 * gpu
    return result


def fmt(x, form="{:.2f}"):
    return form.format(x) if isinstance(x, (int, float)) and not math.isnan(x) else "–"


def ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def markdown(host):
    """The section's three tables: the C++ levels, the PyTorch comparison, GPU time per call."""
    lines = [f"\n| host µs per forward call from C++, {host['shape']} (median of {host.get('rounds', 1)} interleaved "
             "rounds) | repeated calls replayed | replay off |", "|---|---|---|"]
    for label, on, off in (
            ("fusedattn::forward (cache lookup included)", "fusedattn_api_us", "fusedattn_api_no_replay_us"),
            ("Plan::run, plan held (replay off: cuDNN's execute on every call, the cuDNN-only baseline)",
             "fusedattn_plan_run_us", "fusedattn_plan_run_no_replay_us"),
            ("a CUDA graph of one memset (what any replay costs at least)", "graph_launch_floor_us",
             "graph_launch_floor_no_replay_us")):
        lines.append(f"| {label} | {fmt(host.get(on))} | {fmt(host.get(off))} |")
    lines += ["", "| host µs per call from PyTorch, same shape | " + " | ".join(KINDS) + " |", "|---|---|---|---|"]
    rows = (("fusedattn.torch.attention", "fusedattn_torch{}_host_us"),
            ("fusedattn.torch.attention, replay off", "fusedattn_torch{}_no_replay_host_us"),
            ("PyTorch SDPA, cuDNN backend", "torch_cudnn{}_host_us"),
            ("PyTorch SDPA, flash backend", "torch_flash{}_host_us"))
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(fmt(host.get(key.format(s))) for s, _ in KINDS.values()) + " |")
    lines.append("| for scale: torch.addcmul(q, k, v), a cheap op of the same three leaves | – | – | "
                 f"{fmt(host.get('autograd_floor_fwd_bwd_host_us'))} |")
    lines.append("| fusedattn.torch / PyTorch cuDNN | " + " | ".join(
        fmt(ratio(host.get(f"fusedattn_torch{s}_host_us"), host.get(f"torch_cudnn{s}_host_us"))) for s, _ in
        KINDS.values()) + " |")
    lines += ["", "| GPU µs per call, back to back | repeated calls replayed | replay off (cuDNN's execute) |",
              "|---|---|---|",
              f"| fusedattn::forward | {fmt(host.get('fusedattn_gpu_us'))} | {fmt(host.get('fusedattn_gpu_no_replay_us'))} |"]
    for label, key in (("PyTorch SDPA, cuDNN backend", "torch_cudnn_gpu_us"),
                       ("PyTorch SDPA, flash backend", "torch_flash_gpu_us")):
        lines.append(f"| {label} | {fmt(host.get(key))} | |")
    if host["throttled"]:
        lines.append("\nEnqueueing came within 15% of GPU time with over a millisecond of GPU work per loop: "
                     "the loops may have waited for the GPU.")
    return lines
