#!/usr/bin/env python3
"""bench/run_bench.py — fusedattn against PyTorch SDPA (cuDNN and flash backends) in one process,
on the same tensors, timed the same way; writes JSON, a markdown table and a bar chart.

    python bench/run_bench.py --lib build/libfusedattn_bench.so --out bench/results [--shapes 2,8192,16,128,causal]
"""
import argparse
import contextlib
import ctypes
import datetime
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TARGET = 0.98  # fusedattn / PyTorch-cuDNN throughput: the same cuDNN kernels run (DESIGN.md §9)
BACKENDS = {"torch_cudnn": SDPBackend.CUDNN_ATTENTION, "torch_flash": SDPBackend.FLASH_ATTENTION}
# fusedattn through its C++ API (the shim) and through its PyTorch adapter, then PyTorch's own.
IMPLS = ["fusedattn", "fusedattn_torch", *BACKENDS]
FA_TORCH = None  # fusedattn.torch, imported in main() from the build's python/ folder when it is there


@dataclass(frozen=True)
class Shape:
    b: int
    s: int
    h_q: int
    h_kv: int
    d: int
    causal: bool

    @property
    def key(self):  # what --shapes takes; ANCHORS.md's row name
        heads = f"{self.h_q}" if self.h_q == self.h_kv else f"{self.h_q}/{self.h_kv}"
        return f"{self.b},{self.s},{heads},{self.d}" + (",causal" if self.causal else "")

    def fwd_flops(self):  # ANCHORS.md: 4·b·h·s_q·s_kv·d, halved when causal
        return 4.0 * self.b * self.h_q * self.s * self.s * self.d / (2 if self.causal else 1)


SHAPES = [Shape(2, 8192, 16, 16, 128, False), Shape(2, 8192, 16, 16, 128, True),
          Shape(8, 2048, 32, 32, 128, True), Shape(1, 32768, 32, 8, 128, True),
          Shape(4, 4096, 16, 16, 64, False)]
TINY = Shape(1, 128, 8, 8, 64, True)  # ANCHORS.md's host-overhead shape


def ptr(tensor):
    return None if tensor is None else ctypes.c_void_p(tensor.data_ptr())


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


class Shim:
    """ctypes view of bench/bench_shim.cpp; a failing call raises RuntimeError with fusedattn's message."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        P, I, F32, LL, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_longlong, ctypes.c_char_p
        D, U = ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_ulonglong)
        fwd = [S, P, P, P, P, P, F32, P]  # spec, q, k, v, o, stats, scale, stream
        for name, args in {"fa_make_spec": [S, S] + [LL] * 7 + [I, I, LL, LL, S, I, S, I],
                           "fa_bench_ragged_step": [S, LL] + [P] * 10 + [F32, P, I, D, S, I],
                           "fa_bench_enqueue_paged_forward": [S] + [P] * 8 + [F32, P, I, S, I],
                           "fa_bench_enqueue_forward_backward": [S] + [P] * 9 + [F32, P, I, S, I],
                           "fa_bench_host_overhead": fwd + [I, D, D, D, S, I],
                           "fa_bench_enqueue_forward": fwd + [I, S, I],
                           "fa_bench_plan_build": [S, D, D, S, I],
                           "fa_bench_cache_stats": [U, D, U, U, U]}.items():
            getattr(self.lib, name).argtypes, getattr(self.lib, name).restype = args, I
        self.lib.fa_build_info.restype = S
        self.lib.fa_bench_set_replay.argtypes, self.lib.fa_bench_set_replay.restype = [I], I

    @contextlib.contextmanager
    def replay(self, enabled):
        """Replay of repeated calls on or off for the whole process (the library is loaded once)
        inside the block, which gets the suffix of its result keys ("" or "_no_replay")."""
        was = self.lib.fa_bench_set_replay(int(enabled))
        try:
            yield "" if enabled else "_no_replay"
        finally:
            self.lib.fa_bench_set_replay(was)

    def _call(self, name, *args):
        err = ctypes.create_string_buffer(8192)
        if getattr(self.lib, name)(*args, err, len(err)) != 0:
            raise RuntimeError(err.value.decode(errors="replace"))

    def build_info(self):
        return self.lib.fa_build_info().decode()

    def make_spec(self, s, dtype="bf16", layout="bshd"):
        return self.spec_string(layout, s.b, s.s, s.s, s.h_q, s.h_kv, s.d, s.causal, dtype=dtype)

    def spec_string(self, layout, b, s_q, s_kv, h_q, h_kv, d, causal, bottom_right=False, page_size=0, pages=0,
                    dtype="bf16"):
        out = ctypes.create_string_buffer(4096)
        self._call("fa_make_spec", layout.encode(), dtype.encode(), b, s_q, s_kv, h_q, h_kv, d, d, int(causal),
                   int(bottom_right), page_size, pages, out, len(out))
        return out.value.decode()

    def ragged_step(self, spec, sequences, cu_seqlens, q, k, v, o, stats, do, dq, dk, dv):
        """Enqueues one packed forward+backward; returns host microseconds spent enqueueing."""
        host_us = ctypes.c_double()
        self._call("fa_bench_ragged_step", spec.encode(), sequences, ptr(cu_seqlens), *map(ptr, (q, k, v, o, stats)),
                   *map(ptr, (do, dq, dk, dv)), math.nan, stream(), 1, ctypes.byref(host_us))
        return host_us.value

    def enqueue_paged_forward(self, spec, q, k_pool, v_pool, o, seq_len_q, seq_len_kv, table_k, table_v, calls):
        self._call("fa_bench_enqueue_paged_forward", spec.encode(),
                   *map(ptr, (q, k_pool, v_pool, o, seq_len_q, seq_len_kv, table_k, table_v)), math.nan, stream(),
                   calls)

    # Kernel times come from cuda_median_ms, the harness PyTorch is timed with, around these calls.
    def forward_ms(self, spec, t, warmup, iters):  # inference: no statistics, like torch.no_grad()
        return cuda_median_ms(lambda: self.enqueue_forward(spec, t, 1), warmup, iters)

    def forward_backward_ms(self, spec, t, warmup, iters):
        return cuda_median_ms(lambda: self.enqueue_forward_backward(spec, t, 1), warmup, iters)

    def enqueue_forward_backward(self, spec, t, calls):
        self._call("fa_bench_enqueue_forward_backward", spec.encode(), *t.fwd_ptrs(True), ptr(t.do), ptr(t.dq),
                   ptr(t.dk), ptr(t.dv), math.nan, stream(), calls)

    def host_overhead(self, spec, t, calls):
        out = [ctypes.c_double() for _ in range(3)]  # API, Plan::run, one-memset graph
        self._call("fa_bench_host_overhead", spec.encode(), *t.fwd_ptrs(False), math.nan, stream(), calls,
                   *map(ctypes.byref, out))
        return [x.value for x in out]

    def enqueue_forward(self, spec, t, calls):
        self._call("fa_bench_enqueue_forward", spec.encode(), *t.fwd_ptrs(False), math.nan, stream(), calls)

    def plan_build_ms(self, spec):
        fwd, bwd = ctypes.c_double(), ctypes.c_double()
        self._call("fa_bench_plan_build", spec.encode(), ctypes.byref(fwd), ctypes.byref(bwd))
        return {"plan_build_fwd_ms": fwd.value, "plan_build_bwd_ms": bwd.value}

    def cache_stats(self):
        counts, build_ms = [ctypes.c_ulonglong() for _ in range(4)], ctypes.c_double()
        self.lib.fa_bench_cache_stats(ctypes.byref(counts[0]), ctypes.byref(build_ms), *map(ctypes.byref, counts[1:]))
        return dict(zip(("builds", "hits", "misses", "evictions"), (c.value for c in counts)), build_ms=build_ms.value)


class Tensors:
    """One shape's data in bshd ([b, s, h, d] contiguous), shared by fusedattn and PyTorch."""

    def __init__(self, shape):
        def uniform(h):  # fresh values in [-1, 1], like the C++ checks
            return (torch.rand(shape.b, shape.s, h, shape.d, device="cuda") * 2 - 1).to(torch.bfloat16)
        self.shape = shape
        self.q, self.k, self.v, self.do = uniform(shape.h_q), uniform(shape.h_kv), uniform(shape.h_kv), uniform(shape.h_q)
        self.o, self.dq, self.dk, self.dv = (torch.empty_like(x) for x in (self.q, self.q, self.k, self.v))
        self.stats = torch.empty(shape.b, shape.h_q, shape.s, 1, device="cuda", dtype=torch.float32)

    def fwd_ptrs(self, stats):
        return ptr(self.q), ptr(self.k), ptr(self.v), ptr(self.o), ptr(self.stats) if stats else None


class TorchSdpa:
    """F.scaled_dot_product_attention on the same tensors, through [b, h, s, d] views."""

    def __init__(self, t, backend):
        self.t, self.backend, self.note, self.repeat_kv = t, backend, "", False
        self.gqa = t.shape.h_q != t.shape.h_kv
        self.leaves = [x.detach().requires_grad_() for x in (t.q, t.k, t.v)]

    def sdpa(self, q, k, v):
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        if self.repeat_kv:  # a backend that refused enable_gqa gets repeated heads (same FLOPs)
            k, v = (x.repeat_interleave(self.t.shape.h_q // self.t.shape.h_kv, dim=1) for x in (k, v))
        gqa = {"enable_gqa": True} if self.gqa and not self.repeat_kv else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.t.shape.causal, **gqa)

    def context(self, grad):
        stack = contextlib.ExitStack()
        stack.enter_context(sdpa_kernel(self.backend))
        stack.enter_context(contextlib.nullcontext() if grad else torch.no_grad())
        return stack

    def forward(self):  # inference: no log-sum-exp
        with self.context(grad=False):
            return self.sdpa(self.t.q, self.t.k, self.t.v)

    def forward_backward(self):
        for leaf in self.leaves:
            leaf.grad = None
        with self.context(grad=True):
            out = self.sdpa(*self.leaves)
        out.backward(self.t.do.transpose(1, 2))

    def probe(self):
        """Runs once; on refusal of enable_gqa switches to repeated K/V heads and notes it."""
        try:
            self.forward()
        except RuntimeError:
            if not self.gqa:
                raise
            self.repeat_kv, self.note = True, "K/V heads repeated (backend refused enable_gqa)"
            self.forward()


class AdapterCall:
    """fusedattn.torch.attention on the same bshd tensors, as a PyTorch user calls it."""

    def __init__(self, t):
        self.t = t
        self.leaves = [x.detach().requires_grad_() for x in (t.q, t.k, t.v)]

    def call(self):
        return FA_TORCH.attention(self.t.q, self.t.k, self.t.v, layout="bshd", causal=self.t.shape.causal)

    def forward(self):
        with torch.no_grad():
            return self.call()

    def ops_forward(self):
        """The adapter's C++ entry alone, without attention()'s Python (a diagnostic: it splits the
        adapter's host time into its Python and its C++)."""
        ops = FA_TORCH._fast
        if not hasattr(self, "ops_id"):
            self.ops_id = FA_TORCH._fast_options_id("bshd", self.t.shape.causal, "top_left", (-1, -1), False,
                                                    "vanilla", False)
        return ops.forward(self.t.q, self.t.k, self.t.v, self.ops_id, 0.125)

    def forward_backward(self):
        for leaf in self.leaves:
            leaf.grad = None
        out = FA_TORCH.attention(*self.leaves, layout="bshd", causal=self.t.shape.causal)
        out.backward(self.t.do)


def cuda_median_ms(fn, warmup, iters):
    """Median of event pairs enqueued back to back behind a spin kernel, one sync at the end: the
    calls then run back to back and each pair is GPU time. fusedattn and PyTorch both go through it."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # ~25 ms at H200 clocks
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def short(error):
    return f"{type(error).__name__}: {error}".splitlines()[0]


def make_timers(shim, spec, t, errors, notes):
    """(forward, forward+backward) timers per implementation, each called with (warmup, iters)."""
    fns = {"fusedattn": (lambda w, n: shim.forward_ms(spec, t, w, n),
                         lambda w, n: shim.forward_backward_ms(spec, t, w, n))}
    if FA_TORCH is None:
        errors[("fusedattn_torch", 0)] = errors[("fusedattn_torch", 1)] = "fusedattn.torch not importable"
    else:
        adapter = AdapterCall(t)
        fns["fusedattn_torch"] = (lambda w, n: cuda_median_ms(adapter.forward, w, n),
                                  lambda w, n: cuda_median_ms(adapter.forward_backward, w, n))
    for name, backend in BACKENDS.items():
        sdpa = TorchSdpa(t, backend)
        try:
            sdpa.probe()
        except Exception as error:  # one backend failing must not hide the others
            errors[(name, 0)] = errors[(name, 1)] = short(error)
            continue
        notes[name] = sdpa.note
        fns[name] = (lambda w, n, s=sdpa: cuda_median_ms(s.forward, w, n),
                     lambda w, n, s=sdpa: cuda_median_ms(s.forward_backward, w, n))
    return fns


def bench_shape(shim, shape, args):
    """Rows for forward and forward+backward. Implementations take turns round by round, so clock
    and thermal drift hit them alike; each value is the median over rounds."""
    spec, t = shim.make_spec(shape), Tensors(shape)
    samples, errors, notes = {}, {}, {}
    fns = make_timers(shim, spec, t, errors, notes)
    for _ in range(args.rounds):
        for name, pair in fns.items():
            for p, fn in enumerate(pair):
                if (name, p) not in errors:
                    try:
                        samples.setdefault((name, p), []).append(fn(args.warmup, args.iters))
                    except Exception as error:
                        errors[(name, p)] = short(error)
    cli = Path(args.lib).parent / "fusedattn"
    rows = []
    for p, pass_name in enumerate(("fwd", "fwd+bwd")):
        flops = shape.fwd_flops() * (3.5 if p else 1.0)
        row = {"shape": shape.key, "pass": pass_name, "spec": spec,
               "command": f"python bench/run_bench.py --lib {args.lib} --shapes {shape.key}",
               "fusedattn_command": f'{cli} bench "{spec}" --iters {args.iters}'}
        for name in IMPLS:
            ms = statistics.median(samples[(name, p)]) if samples.get((name, p)) else None
            row[f"{name}_ms"], row[f"{name}_tflops"] = ms, (flops / (ms * 1e-3) / 1e12 if ms else None)
            if (name, p) in errors:
                row[f"{name}_error"] = errors[(name, p)]
            if notes.get(name):
                row[f"{name}_note"] = notes[name]
        ours, theirs, adapter = row["fusedattn_tflops"], row["torch_cudnn_tflops"], row["fusedattn_torch_tflops"]
        row["ratio_vs_cudnn"] = ours / theirs if ours and theirs else None
        row["torch_adapter_ratio_vs_cudnn"] = adapter / theirs if adapter and theirs else None
        row["meets_target"] = bool(row["ratio_vs_cudnn"] and row["ratio_vs_cudnn"] >= TARGET)
        rows.append(row)
    rows[0].update(shim.plan_build_ms(spec))  # rebuilt from a cleared cache, after the timings
    return rows


def relative_error(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def sanity(shim, shape):
    """fusedattn's O and gradients against PyTorch's cuDNN backend and a float32 math reference."""
    spec, t = shim.make_spec(shape), Tensors(shape)
    shim.enqueue_forward_backward(spec, t, 1)
    torch.cuda.synchronize()
    ours = {"O": t.o, "dQ": t.dq, "dK": t.dk, "dV": t.dv}
    out = {"shape": shape.key, "spec": spec}
    for name, backend, dtype in (("torch_cudnn", SDPBackend.CUDNN_ATTENTION, torch.bfloat16),
                                 ("math_f32", SDPBackend.MATH, torch.float32)):
        try:
            leaves = [x.detach().to(dtype).requires_grad_() for x in (t.q, t.k, t.v)]
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in leaves), is_causal=shape.causal,
                                                   enable_gqa=shape.h_q != shape.h_kv)
            o.backward(t.do.to(dtype).transpose(1, 2))
            theirs = {"O": o.transpose(1, 2), "dQ": leaves[0].grad, "dK": leaves[1].grad, "dV": leaves[2].grad}
            out[f"vs_{name}"] = {key: relative_error(ours[key], theirs[key]) for key in ours}
        except Exception as error:
            out[f"vs_{name}"] = short(error)
    return out


def gpu_us_per_call(enqueue, calls=200):
    """GPU time per call with the queue filled behind a spin kernel, so launch cost is hidden."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(50_000_000)  # ~25 ms of spinning: far longer than enqueueing `calls`
    start.record()
    enqueue(calls)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def host_us(fn, calls, context=contextlib.nullcontext):
    """Host microseconds per call of a Python loop without synchronization, after a short warm-up."""
    with context():  # entered once: the loop times only the call, as a user runs it
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - begin
        torch.cuda.synchronize()
    return elapsed * 1e6 / calls


def host_overhead(shim, calls, lib, rounds=11):
    """Host time to enqueue one forward at the tiny shape: three C++ levels and fusedattn.torch,
    with repeated calls replayed and with replay off, and PyTorch's own. Every loop takes turns
    with the others for `rounds` rounds and reports its median, so that the host's drift during
    the run touches all of them alike (hosts here differ by up to 1.7x from run to run)."""
    spec, t = shim.make_spec(TINY), Tensors(TINY)
    shim.forward_ms(spec, t, 5, 20)  # builds the plan
    result = {"shape": TINY.key, "spec": spec, "calls": calls, "rounds": rounds,
              "command": f"python bench/run_bench.py --lib {lib} --shapes none"}
    sdpas = {name: TorchSdpa(t, backend) for name, backend in BACKENDS.items()}
    loops = {}  # result key: (call, context the loop runs in)
    for name, sdpa in sdpas.items():
        loops[f"{name}_host_us"] = (lambda s=sdpa: s.sdpa(t.q, t.k, t.v), lambda s=sdpa: s.context(grad=False))
    if FA_TORCH is not None:
        adapter = AdapterCall(t)
        loops.update({"fusedattn_torch_host_us": (adapter.call, torch.no_grad),
                      "fusedattn_torch_ops_forward_host_us": (adapter.ops_forward, torch.no_grad),
                      "fusedattn_torch_fwd_bwd_host_us": (adapter.forward_backward, contextlib.nullcontext),
                      "torch_cudnn_fwd_bwd_host_us": (sdpas["torch_cudnn"].forward_backward, contextlib.nullcontext)})
    samples = {}
    for _ in range(rounds):
        for replay in (True, False):
            with shim.replay(replay) as suffix:
                for key, (fn, context) in loops.items():
                    if suffix and not key.startswith("fusedattn"):
                        continue  # PyTorch's own calls do not depend on the switch: once a round
                    name = key.replace("_host_us", f"{suffix}_host_us")
                    samples.setdefault(name, []).append(host_us(fn, calls, context))
    result.update({key: statistics.median(values) for key, values in samples.items()})
    for replay in (True, False):  # the C++ levels take turns inside the shim, 11 rounds each
        with shim.replay(replay) as suffix:
            api, plan_run, graph_floor = shim.host_overhead(spec, t, calls)
        # With replay off, Plan::run sends every call through cuDNN's execute: the cuDNN-only baseline.
        result.update({f"fusedattn_api{suffix}_us": api, f"fusedattn_plan_run{suffix}_us": plan_run,
                       f"graph_launch_floor{suffix}_us": graph_floor})
    for replay in (True, False):  # a replayed call's graph launch costs the GPU time too (README)
        with shim.replay(replay) as suffix:
            result[f"fusedattn_gpu{suffix}_us"] = gpu_us_per_call(lambda n: shim.enqueue_forward(spec, t, n))
    for name, sdpa in sdpas.items():
        with sdpa.context(grad=False):
            result[f"{name}_gpu_us"] = gpu_us_per_call(lambda n, s=sdpa: [s.sdpa(t.q, t.k, t.v) for _ in range(n)])
    # A loop that leaves the GPU more than about a millisecond behind may wait for it: a replayed
    # call enqueues faster than the GPU runs this tiny problem.
    gpu = result["fusedattn_gpu_us"]
    result["throttled"] = calls * gpu > 1000 and result["fusedattn_api_us"] >= 0.85 * gpu
    return result


def fmt(x, form="{:.1f}"):
    return form.format(x) if isinstance(x, (int, float)) and not math.isnan(x) else "–"


def markdown(rows, host, check):
    lines = [f"| shape (b, s, h_q[/h_kv], d) | pass | fusedattn | fusedattn.torch | PyTorch cuDNN | PyTorch flash | "
             f"fusedattn / cuDNN (target ≥ {TARGET}) | fusedattn.torch / cuDNN |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = " ✓" if r["meets_target"] else " ✗"
        lines.append(f"| {r['shape']} | {r['pass']} | " + " | ".join(fmt(r[f"{n}_tflops"]) for n in IMPLS) +
                     f" | {fmt(r['ratio_vs_cudnn'], '{:.3f}')}{mark} | "
                     f"{fmt(r.get('torch_adapter_ratio_vs_cudnn'), '{:.3f}')} |")
    lines.append("\nTFLOP/s, BF16, bshd; median over interleaved rounds of medians of event-timed calls.")
    if host:
        lines += [f"\n| host µs per forward call, {host['shape']} (median of {host.get('rounds', 1)} interleaved "
                  "rounds) | repeated calls replayed | replay off |", "|---|---|---|"]
        for label, on, off in (
                ("fusedattn::forward (cache lookup included)", "fusedattn_api_us", "fusedattn_api_no_replay_us"),
                ("Plan::run (plan held; replay off: cuDNN's execute on every call, the cuDNN-only baseline)",
                 "fusedattn_plan_run_us", "fusedattn_plan_run_no_replay_us"),
                ("a CUDA graph of one memset (what any replay costs at least)", "graph_launch_floor_us",
                 "graph_launch_floor_no_replay_us"),
                ("fusedattn.torch.attention (forward, no grad)", "fusedattn_torch_host_us",
                 "fusedattn_torch_no_replay_host_us"),
                ("its C++ entry alone (_torch_ops.forward, no Python around it)",
                 "fusedattn_torch_ops_forward_host_us", "fusedattn_torch_ops_forward_no_replay_host_us"),
                ("fusedattn.torch.attention, forward + backward", "fusedattn_torch_fwd_bwd_host_us",
                 "fusedattn_torch_fwd_bwd_no_replay_host_us")):
            lines.append(f"| {label} | {fmt(host.get(on), '{:.2f}')} | {fmt(host.get(off), '{:.2f}')} |")
        for label, key in (("PyTorch SDPA, cuDNN backend", "torch_cudnn_host_us"),
                           ("PyTorch SDPA, cuDNN backend, forward + backward", "torch_cudnn_fwd_bwd_host_us"),
                           ("PyTorch SDPA, flash backend", "torch_flash_host_us")):
            lines.append(f"| {label} | {fmt(host.get(key), '{:.2f}')} | |")
        lines += ["", "| GPU µs per call, back to back | repeated calls replayed | replay off |", "|---|---|---|",
                  f"| fusedattn::forward (replay off: cuDNN's execute on every call) | {fmt(host.get('fusedattn_gpu_us'), '{:.2f}')} | "
                  f"{fmt(host.get('fusedattn_gpu_no_replay_us'), '{:.2f}')} |"]
        for label, key in (("PyTorch SDPA, cuDNN backend", "torch_cudnn_gpu_us"),
                           ("PyTorch SDPA, flash backend", "torch_flash_gpu_us")):
            lines.append(f"| {label} | {fmt(host.get(key), '{:.2f}')} | |")
        if host["throttled"]:
            lines.append("\nEnqueueing came within 15% of GPU time with over a millisecond of GPU work per loop: "
                         "the loops may have waited for the GPU.")
    if check:
        def errs(x):
            return ", ".join(f"{k} {v:.1e}" for k, v in x.items()) if isinstance(x, dict) else str(x)
        lines.append(f"\nSanity at {check['shape']}, relative L2 error of fusedattn: vs PyTorch cuDNN "
                     f"{errs(check.get('vs_torch_cudnn'))}; vs float32 math {errs(check.get('vs_math_f32'))}")
    return "\n".join(lines)


def chart(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(rows)), 5))
    width = 0.8 / len(IMPLS)
    for i, name in enumerate(IMPLS):
        ax.bar([x + i * width for x in range(len(rows))], [r[f"{name}_tflops"] or 0 for r in rows], width, label=name)
    ax.set_xticks([x + width for x in range(len(rows))], [f"{r['shape']}\n{r['pass']}" for r in rows], fontsize=7)
    ax.set_ylabel("TFLOP/s (BF16)")
    ax.set_title("fusedattn vs PyTorch SDPA: same tensors, one process")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def guarded(what, failures, fn, *args):
    try:
        return fn(*args)
    except Exception as error:  # report it and carry on with the rest
        traceback.print_exc()
        failures.append({"what": what, "error": f"{type(error).__name__}: {error}"})
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lib_path", nargs="?", metavar="LIB", help="path to libfusedattn_bench.so (or --lib)")
    parser.add_argument("--lib", help="path to libfusedattn_bench.so")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--name", help="results file stem (default: date and GPU)")
    parser.add_argument("--shapes", nargs="*", help="keys such as 2,8192,16,128,causal ('none': host section only)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    # Few enough that the GPU, which takes longer per call than a replayed call's enqueueing at
    # the tiny shape, never falls so far behind that enqueueing waits: the loops measure host time.
    parser.add_argument("--host-calls", type=int, default=64)
    args = parser.parse_args()
    args.lib = args.lib or args.lib_path
    if not args.lib:
        parser.error("give the path to libfusedattn_bench.so")

    shim = Shim(args.lib)
    global FA_TORCH
    sys.path.insert(0, str(Path(args.lib).parent / "python"))  # the package the build made (FUSEDATTN_PYTHON)
    try:
        import fusedattn.torch as adapter
        FA_TORCH = adapter
    except ImportError as error:
        print(f"fusedattn.torch not importable ({error}): its columns stay empty", flush=True)
    info = shim.build_info()
    print(f"{info}\nPyTorch {torch.__version__}, its cuDNN {torch.backends.cudnn.version()}\n", flush=True)
    shapes = [s for s in SHAPES if args.shapes is None or s.key in args.shapes]
    failures, rows = [], []
    for shape in shapes:
        print(f"shape {shape.key} ...", flush=True)
        rows += guarded(f"shape {shape.key}", failures, bench_shape, shim, shape, args) or []
    check_shape = next((s for s in shapes if s.key == "4,4096,16,64"), shapes[0] if shapes else TINY)
    check = guarded("sanity", failures, sanity, shim, check_shape)
    host = guarded("host overhead", failures, host_overhead, shim, args.host_calls, args.lib)

    gpu = torch.cuda.get_device_name()
    name = args.name or f"{datetime.datetime.now():%Y%m%d-%H%M}_{gpu.replace(' ', '_')}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if rows:
        guarded("chart", failures, chart, rows, out / f"{name}.png")
    table = markdown(rows, host, check)
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "build_info": info, "gpu": gpu,
              "torch": torch.__version__, "torch_cudnn": torch.backends.cudnn.version(), "argv": sys.argv,
              "target_ratio": TARGET, "rows": rows, "host_overhead": host, "sanity": check,
              "plan_cache": shim.cache_stats(), "failures": failures}
    (out / f"{name}.json").write_text(json.dumps(record, indent=2))
    (out / f"{name}.md").write_text(table + "\n")
    print(f"\nwrote {out / name}.json, .md, .png")
    for failure in failures:
        print(f"FAILED {failure['what']}: {failure['error']}")
    print("\n" + table)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
