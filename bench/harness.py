"""bench/harness.py — what the PyTorch benchmarks share: the build's modules, fusedattn's C++ API
through fusedattn_bench (bench/bench_module.cpp), the tensors, PyTorch's and fusedattn.torch's
calls on them, and the two timers (GPU time from CUDA events, host time of Python loops).
"""
import collections
import contextlib
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

BACKENDS = {"torch_cudnn": SDPBackend.CUDNN_ATTENTION, "torch_flash": SDPBackend.FLASH_ATTENTION}


def load(build):
    """(fusedattn_bench, fusedattn.torch or None) from `build`/python, where a build configured with
    FUSEDATTN_PYTHON=ON puts the package and the benchmark's module side by side."""
    sys.path.insert(0, str(Path(build) / "python"))
    try:
        import fusedattn_bench
    except ImportError as error:
        raise SystemExit(f"fusedattn_bench is not in {Path(build) / 'python'} ({error}): configure that build with "
                         "-DFUSEDATTN_PYTHON=ON (it needs nanobind) and build it")
    try:
        import fusedattn.torch as adapter
    except ImportError as error:
        print(f"fusedattn.torch not importable ({error}): its columns stay empty", flush=True)
        adapter = None
    return fusedattn_bench, adapter


def address(tensor):
    """A tensor's device address for fusedattn_bench; 0 for none."""
    return 0 if tensor is None else tensor.data_ptr()


def stream():
    return torch.cuda.current_stream().cuda_stream


def short(error):
    return f"{type(error).__name__}: {error}".splitlines()[0]


def write_results(out, stem, record, table_lines):
    """A benchmark's one file name under `out`, overwritten each run: `record` as <stem>.json and the
    table as <stem>.md, which is printed too."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    table = "\n".join(table_lines)
    (out / f"{stem}.md").write_text(table + "\n")
    print(table)


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


class Tensors:
    """One shape's data in bshd ([b, s, h, d] contiguous), shared by fusedattn and PyTorch."""

    def __init__(self, shape):
        def uniform(h):  # fresh values in [-1, 1], like the C++ checks
            return (torch.rand(shape.b, shape.s, h, shape.d, device="cuda") * 2 - 1).to(torch.bfloat16)
        self.shape = shape
        self.q, self.k, self.v, self.do = uniform(shape.h_q), uniform(shape.h_kv), uniform(shape.h_kv), uniform(shape.h_q)
        self.o, self.dq, self.dk, self.dv = (torch.empty_like(x) for x in (self.q, self.q, self.k, self.v))
        self.stats = torch.empty(shape.b, shape.h_q, shape.s, 1, device="cuda", dtype=torch.float32)

    def forward(self, stats):
        """The forward call's tensors as fusedattn_bench's keywords (statistics only when asked)."""
        return dict(q=address(self.q), k=address(self.k), v=address(self.v), o=address(self.o),
                    stats=address(self.stats) if stats else 0)

    def backward(self):
        return dict(self.forward(True), d_o=address(self.do), d_q=address(self.dq), d_k=address(self.dk),
                    d_v=address(self.dv))


class Bench:
    """fusedattn's C++ API through fusedattn_bench, on this process's tensors and PyTorch's current
    stream. Errors are fusedattn.errors' classes."""

    def __init__(self, module):
        self.module = module

    @contextlib.contextmanager
    def replay(self, enabled):
        """Replay of repeated calls on or off for the whole process inside the block, which gets the
        suffix of its result keys ("" or "_no_replay"); the setting is restored even on failure."""
        was = self.module.set_replay(enabled)
        try:
            yield "" if enabled else "_no_replay"
        finally:
            self.module.set_replay(was)

    @contextlib.contextmanager
    def tuned(self):
        """Autotuned plans inside the block (the process default restored after it): get_plan then
        reaches the tuned entries, separate from the heuristics' ones."""
        was = self.module.set_autotune(True)
        try:
            yield
        finally:
            self.module.set_autotune(was)

    def build_info(self):
        return self.module.build_info()

    def make_spec(self, s, dtype="bf16", layout="bshd"):
        return self.spec_string(layout, s.b, s.s, s.s, s.h_q, s.h_kv, s.d, s.causal, dtype=dtype)

    def spec_string(self, layout, b, s_q, s_kv, h_q, h_kv, d, causal, bottom_right=False, page_size=0, pages=0,
                    dtype="bf16"):
        return self.module.make_spec(layout, dtype=dtype, b=b, s_q=s_q, s_kv=s_kv, h_q=h_q, h_kv=h_kv, d_qk=d, d_v=d,
                                     causal=causal, bottom_right=bottom_right, page_size=page_size, pages=pages)

    def enqueue_forward(self, spec, t, calls):  # inference: no statistics, like torch.no_grad()
        self.module.enqueue_forward(spec, **t.forward(False), stream=stream(), calls=calls)

    def enqueue_forward_backward(self, spec, t, calls):
        self.module.enqueue_forward_backward(spec, **t.backward(), stream=stream(), calls=calls)

    # Kernel times come from cuda_median_ms, the harness PyTorch is timed with, around these calls.
    def forward_ms(self, spec, t, warmup, iters):
        return cuda_median_ms(lambda: self.enqueue_forward(spec, t, 1), warmup, iters)

    def forward_backward_ms(self, spec, t, warmup, iters):
        return cuda_median_ms(lambda: self.enqueue_forward_backward(spec, t, 1), warmup, iters)

    def host_overhead(self, spec, t, calls):
        """{'api_us', 'plan_run_us', 'graph_floor_us'}: host µs per forward call, timed in C++."""
        return self.module.host_overhead(spec, **t.forward(False), stream=stream(), calls=calls)

    def ragged_step(self, spec, sequences, cu_seqlens, q, k, v, o, stats, do, dq, dk, dv):
        """Enqueues one packed forward+backward; returns host microseconds spent enqueueing."""
        return self.module.ragged_step(spec, sequences=sequences, cu_seqlens=address(cu_seqlens), q=address(q),
                                       k=address(k), v=address(v), o=address(o), stats=address(stats),
                                       d_o=address(do), d_q=address(dq), d_k=address(dk), d_v=address(dv),
                                       stream=stream())

    def enqueue_paged_forward(self, spec, q, k_pool, v_pool, o, seq_len_q, seq_len_kv, table_k, table_v, calls):
        self.module.enqueue_paged_forward(spec, q=address(q), k_pool=address(k_pool), v_pool=address(v_pool),
                                          o=address(o), seq_len_q=address(seq_len_q), seq_len_kv=address(seq_len_kv),
                                          page_table_k=address(table_k), page_table_v=address(table_v),
                                          stream=stream(), calls=calls)

    def plan_build_ms(self, spec):
        return self.module.plan_build_ms(spec)

    def cache_stats(self):
        from fusedattn import _core  # the package's own counters: one plan cache for the process
        return _core.plan_cache_stats()


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
        """The backend, and grad mode on (training) or off (inference)."""
        stack = contextlib.ExitStack()
        stack.enter_context(sdpa_kernel(self.backend))
        stack.enter_context(torch.enable_grad() if grad else torch.no_grad())
        return stack

    # The bodies, for loops that enter context() once, as a user's loop would.
    def inference(self):  # no log-sum-exp
        return self.sdpa(self.t.q, self.t.k, self.t.v)

    def train_forward(self):  # inputs that require grad: the forward saves what the backward needs
        return self.sdpa(*self.leaves)

    def train_step(self):
        for leaf in self.leaves:
            leaf.grad = None
        self.sdpa(*self.leaves).backward(self.t.do.transpose(1, 2))

    # Each in its own context, for the kernel timers.
    def forward(self):
        with self.context(grad=False):
            return self.inference()

    def forward_backward(self):
        with self.context(grad=True):
            self.train_step()

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

    def __init__(self, adapter, t):
        self.adapter, self.t = adapter, t
        self.leaves = [x.detach().requires_grad_() for x in (t.q, t.k, t.v)]

    def attention(self, q, k, v):
        return self.adapter.attention(q, k, v, layout="bshd", causal=self.t.shape.causal)

    # The bodies, for loops that set grad mode once (torch.no_grad / torch.enable_grad).
    def inference(self):
        return self.attention(self.t.q, self.t.k, self.t.v)

    def train_forward(self):
        return self.attention(*self.leaves)

    def train_step(self):
        for leaf in self.leaves:
            leaf.grad = None
        self.attention(*self.leaves).backward(self.t.do)

    # Each in its own grad mode, for the kernel timers.
    def forward(self):
        with torch.no_grad():
            return self.inference()

    def forward_backward(self):
        with torch.enable_grad():
            self.train_step()


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


def forward_and_training_ms(calls, grads, *, rounds, warmup, iters):
    """{(name, 0): forward ms, (name, 1): forward+backward ms} of each of `calls` (name -> a call
    returning O; its backward takes grads[name]), the median over `rounds` rounds of cuda_median_ms,
    the calls taking turns in each round so that clocks drift alike for all. A call that fails gets
    its error's short text there instead, and hides none of the others."""
    ms = {}
    for _ in range(rounds):
        for name, call in calls.items():
            for p, timed in enumerate((call, lambda c=call, g=grads[name]: c().backward(g))):
                if isinstance(ms.get((name, p)), str):
                    continue  # failed in an earlier round
                try:
                    with torch.no_grad() if p == 0 else torch.enable_grad():
                        ms.setdefault((name, p), []).append(cuda_median_ms(timed, warmup, iters))
                except Exception as error:  # noqa: BLE001
                    ms[(name, p)] = short(error)
    return {key: value if isinstance(value, str) else sorted(value)[len(value) // 2] for key, value in ms.items()}


def captured_median_ms(fn, warmup, iters):
    """cuda_median_ms of one call of `fn` captured in a CUDA graph and replayed back to back: its
    kernels' GPU time as a captured step (a serving engine's decode step) runs them, with the
    graph's own launch in place of each kernel's."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return cuda_median_ms(graph.replay, warmup, iters)


def kernel_times(step, steps=5):
    """The kernels `step` launches, from torch.profiler over `steps` calls after 3 warm-up calls:
    (name, launches a call, ms a call), longest first. For the diagnostics, not the benchmarks."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name][0] += 1
            totals[event.name][1] += event.device_time_total / 1000.0
    return [(name, count // steps, ms / steps) for name, (count, ms) in sorted(totals.items(), key=lambda x: -x[1][1])]


def kernel_timeline(step, steps=4):
    """Every kernel of `steps` calls of `step` enqueued back to back behind a spin kernel (so the GPU,
    not the host, sets the pace), from torch.profiler: (name, start µs, end µs) in start order, times
    from the first kernel's start. A kernel launched early (programmatic dependent launch) starts
    before the one ahead of it ends. For the diagnostics, not the benchmarks."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(20_000_000)
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA and "spin" not in e.name)
    first = kernels[0][0] if kernels else 0
    return [(name, start - first, end - first) for start, end, name in kernels]


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


def host_us(fn, calls, context=contextlib.nullcontext, until_done=False):
    """Host microseconds per call of a Python loop without synchronization, after a short warm-up;
    with `until_done`, until the GPU has finished the loop's work too: the larger of the host's and
    the GPU's time per call, as an eager loop gets it."""
    with context():  # entered once: the loop times only the call, as a user runs it
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        if until_done:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - begin
        torch.cuda.synchronize()
    return elapsed * 1e6 / calls
