#!/usr/bin/env python3
"""bench/run_bench_fp8_api.py — FP8 through the public API: fusedattn.torch.fp8_attention with a
delayed-scaling Fp8State beside fusedattn.torch.attention in BF16, on the same BF16 inputs in one
process, eager and under torch.compile(fullgraph=True), forward alone and a training step, the
FP8 backward and the model-precision one; quantization and the recipe's bookkeeping included, as
users pay for them. Also: the FP8 call split into one call per batch entry; the FP8 step's GPU time
split into cuDNN's attention and the rest (fp8_api_profile.py); and fusedattn.jax's FP8 beside its
BF16 under jax.jit (fp8_api_jax.py, in its own process). Writes JSON and markdown.

    python bench/run_bench_fp8_api.py --build build             # writes results/bench-fp8-api.{json,md}
    python bench/run_bench_fp8_api.py --build build --dry-run   # no GPU: every call traced, nothing timed

Timing: harness.forward_and_training_ms (CUDA events around calls enqueued back to back, median of
--iters after --warmup, median over --rounds rounds that interleave the calls). A training step is
the forward on inputs that require grad and out.backward(dO), their grads cleared first, as
activations' are. Each FP8 call has its own state (one per layer), updated in place from call to call.
--dry-run runs each call once on meta tensors (compiled ones with the aot_eager backend) and exports
the JAX programs for CUDA: every argument and road is checked where there is no GPU.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import fp8_api_profile
from harness import Shape, forward_and_training_ms, short

# BF16 time over FP8 time (FP8's speedup), at least (DESIGN.md §9), and the share of the FP8 step's
# GPU time that quantization and bookkeeping may take at most.
TARGETS = {"2,8192,16,128,causal": (1.35, 1.15), "1,8192,64/8,128,causal": (1.35, 1.15),
           "4,4096,32,128": (1.35, 1.15), "8,2048,32,128,causal": (1.0, 1.0)}  # (forward, training step)
SHAPES = {s.key: s for s in (Shape(2, 8192, 16, 16, 128, True), Shape(1, 8192, 64, 8, 128, True),
                             Shape(4, 4096, 32, 32, 128, False), Shape(8, 2048, 32, 32, 128, True))}
SHARE_TARGET = 0.10
# The rows of the table: (label, the FP8 call, pass 0 forward / 1 step) against BF16's same pass.
ROWS = [("fwd", "fp8", 0), ("step, FP8 bwd", "fp8", 1), ("step, model bwd", "fp8 model bwd", 1)]


class Pieces(list):
    """The outputs of a call split by batch entry: backward() is one autograd pass over all of them,
    as out.backward(dO) is for one output."""

    def backward(self, grads):
        torch.autograd.backward(list(self), list(grads))


def inputs(shape, device):
    """q, k, v, dO: [b, s, h, d] BF16, uniform in [-1, 1]."""
    torch.manual_seed(0)
    return [(torch.rand(shape.b, shape.s, h, shape.d, device=device) * 2 - 1).to(torch.bfloat16)
            for h in (shape.h_q, shape.h_kv, shape.h_kv, shape.h_q)]


def torch_calls(fa, shape, q, k, v, d_o, *, device, backend, split):
    """name -> a call returning O (Pieces for a split one), and name -> its dO. Every call clears its
    inputs' grads first; FP8 calls each get a fresh state."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

    def on(leaves, fn):
        def call():
            for leaf in leaves:
                leaf.grad = None
            return fn(*leaves)
        return call

    def bf16(q, k, v):
        return fa.attention(q, k, v, causal=shape.causal)

    def fp8(backward):
        state = fa.Fp8State("delayed", device=device)
        return lambda q, k, v: fa.fp8_attention(q, k, v, state, causal=shape.causal, backward=backward)

    calls = {}
    for road, wrap in (("eager", lambda f: f),
                       ("compiled", lambda f: torch.compile(f, fullgraph=True, dynamic=False, backend=backend))):
        for name, fn in (("bf16", bf16), ("fp8", fp8("fp8")), ("fp8 model bwd", fp8("model"))):
            calls[f"{road} {name}"] = on(leaves, wrap(fn))
    grads = {name: d_o for name in calls}
    if split and shape.b > 1:
        # One state per entry's call: one state used b times a step would move its delayed histories
        # b times a step, which no training run does. Each entry's inputs are leaves of their own,
        # so the time is the calls' own, without autograd scattering b slices' grads into one tensor.
        parts = [[x[i:i + 1].detach().requires_grad_() for x in (q, k, v)] for i in range(shape.b)]
        entries = [on(part, fp8("fp8")) for part in parts]
        calls["eager fp8 split"] = lambda: Pieces(entry() for entry in entries)
        grads["eager fp8 split"] = [d_o[i:i + 1] for i in range(shape.b)]
    return calls, grads


def traced_once(calls, grads):
    """--dry-run's stand-in for the timer: each call once in each pass; None, or the error's text."""
    out = {}
    for name, call in calls.items():
        for p in (0, 1):
            try:
                with torch.no_grad() if p == 0 else torch.enable_grad():
                    o = call()
                    if p:
                        o.backward(grads[name])
                out[(name, p)] = None
            except Exception as error:  # noqa: BLE001
                out[(name, p)] = short(error)
    return out


def relative_error(fa, shape, q, k, v):
    """||FP8 O - BF16 O|| / ||BF16 O||, eager: the FP8 calls compute the same attention."""
    state = fa.Fp8State("delayed")
    with torch.no_grad():
        ref = fa.attention(q, k, v, causal=shape.causal).float()
        fa.fp8_attention(q, k, v, state, causal=shape.causal)  # the delayed scales come from this call's amaxes
        o = fa.fp8_attention(q, k, v, state, causal=shape.causal).float()
    return ((o - ref).norm() / ref.norm()).item()


def torch_shape(fa, shape, args, device):
    """{"torch": {"<call>|<pass>": ms or text}, "rel_error": ..., "profile": ...} of one shape."""
    torch._dynamo.reset()  # each shape compiles its own programs; the last shape's are dropped
    q, k, v, d_o = inputs(shape, device)
    calls, grads = torch_calls(fa, shape, q, k, v, d_o, device=device, backend="aot_eager" if args.dry_run
                               else "inductor", split=not args.no_split)
    if args.dry_run:
        return dict(torch={f"{n}|{p}": v for (n, p), v in traced_once(calls, grads).items()})
    ms = forward_and_training_ms(calls, grads, rounds=args.rounds, warmup=args.warmup, iters=args.iters)
    out = dict(torch={f"{n}|{p}": v for (n, p), v in ms.items()}, rel_error=relative_error(fa, shape, q, k, v))
    if not args.no_profile:  # the first profile is the one held against SHARE_TARGET
        step = lambda name: lambda: calls[name]().backward(d_o)  # noqa: E731
        forward = lambda: torch.no_grad()(calls["eager fp8"])()  # noqa: E731
        out["profile"] = fp8_api_profile.profile({
            "FP8 step, FP8 bwd": step("eager fp8"), "FP8 step, model bwd": step("eager fp8 model bwd"),
            "FP8 fwd": forward, "BF16 step": step("eager bf16")}, args.profile_calls)
    return out


def jax_road(args, keys):
    """fp8_api_jax.py's result, run in a process of its own; its failure said, not raised."""
    command = [sys.executable, "-X", "faulthandler", str(Path(__file__).with_name("fp8_api_jax.py")),
               "--build", args.build, "--rounds", str(args.rounds), "--warmup", str(args.warmup),
               "--iters", str(args.iters), "--shapes", *keys] + (["--dry-run"] if args.dry_run else [])

    def failed(why):
        return dict(ms={}, notes=[f"JAX road not measured: bench/fp8_api_jax.py {why}; its errors are in the log"])
    try:  # its progress and errors go to this process's stderr, its result is its last line
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=args.jax_timeout)
    except subprocess.TimeoutExpired:
        return failed(f"ran past --jax-timeout {args.jax_timeout} s")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return failed(f"exited with {done.returncode} and no result")


def rows_of(road, ms, targets):
    """Table rows of one road from {"<call>|<pass>": ms or text}; `targets`: (forward, step)."""
    rows = []
    for label, fp8, p in ROWS:
        bf16_ms, fp8_ms = ms.get(f"bf16|{p}"), ms.get(f"{fp8}|{p}")
        speedup = bf16_ms / fp8_ms if isinstance(bf16_ms, float) and isinstance(fp8_ms, float) else None
        rows.append(dict(road=road, pass_=label, bf16_ms=bf16_ms, fp8_ms=fp8_ms, speedup=speedup,
                         target=targets[p], met=None if speedup is None else speedup >= targets[p]))
    return rows


def split_rows(ms):
    """The FP8 call split by batch entry beside one call, each pass (none where it did not run)."""
    rows = []
    for p, label in ((0, "fwd"), (1, "step")):
        one, split = ms.get(f"eager fp8|{p}"), ms.get(f"eager fp8 split|{p}")
        if f"eager fp8 split|{p}" in ms:
            gain = one / split if isinstance(one, float) and isinstance(split, float) else None
            rows.append(dict(pass_=label, one_call_ms=one, split_ms=split, split_speedup=gain))
    return rows


def cell(x, form="{:.3f}"):
    return "–" if x is None else form.format(x) if isinstance(x, float) else str(x)


def markdown(meta, results, notes):
    cudnn = next((line for line in meta["build_info"].splitlines() if "cuDNN" in line), "")
    lines = ["# FP8 through the public API", "",
             f"{meta['gpu']}, commit {meta['commit']}, {meta['date']}; torch {meta['torch']}, "
             f"jax {meta.get('jax', '–')}; {cudnn}", "",
             "| shape | road | pass | BF16 ms | FP8 ms | FP8/BF16 speedup | target |", "|---|---|---|---|---|---|---|"]
    for key, result in results.items():
        for row in result["rows"]:
            met = {None: "", True: " ✓", False: " ✗"}[row["met"]]
            lines.append(f"| {key} | {row['road']} | {row['pass_']} | {cell(row['bf16_ms'])} | "
                         f"{cell(row['fp8_ms'])} | {cell(row['speedup'], '{:.2f}x')} | ≥ {row['target']}x{met} |")
    lines += ["", "Speedup: BF16 ms / FP8 ms (above 1: FP8 is faster). Each FP8 call quantizes its BF16 inputs "
              "inside and returns O and the gradients in BF16; delayed scaling, its state updated in place from "
              "call to call. Rel. L2 of FP8 O from BF16 O (eager): "
              + ", ".join(f"{k} {cell(r.get('rel_error'), '{:.1e}')}" for k, r in results.items()) + ".", "",
              "## The FP8 call split into one call per batch entry (eager, FP8 backward, one state per entry)", "",
              "| shape | pass | one call ms | one call per entry ms | split speedup | split faster? |",
              "|---|---|---|---|---|---|"]
    for key, result in results.items():
        for row in result["split"]:
            gain = row["split_speedup"]
            lines.append(f"| {key} | {row['pass_']} | {cell(row['one_call_ms'])} | {cell(row['split_ms'])} | "
                         f"{cell(gain, '{:.2f}x')} | {'–' if gain is None else 'yes' if gain > 1 else 'no'} |")
    profiles = {k: r["profile"] for k, r in results.items() if r.get("profile")}
    if profiles:
        lines += ["", "## Quantization and bookkeeping: GPU time outside cuDNN's attention kernels (eager, "
                  "torch.profiler)", ""] + fp8_api_profile.markdown(profiles, SHARE_TARGET)
    if notes:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def tabulate(results, jax_ms):
    """Adds each shape's JAX numbers, table rows and split rows to `results`; returns what failed, and
    each target a measured number misses (a number not measured misses none: it failed)."""
    failures, missed = [], []
    for key, result in results.items():
        torch_ms, result["jax"] = result["torch"], jax_ms.get(key, {})
        roads = {"torch eager": {k.removeprefix("eager "): v for k, v in torch_ms.items()},
                 "torch compiled": {k.removeprefix("compiled "): v for k, v in torch_ms.items()},
                 "jax jit": {k.replace("|fwd", "|0").replace("|step", "|1"): v for k, v in result["jax"].items()}}
        result["rows"] = [row for road, ms in roads.items() for row in rows_of(road, ms, TARGETS[key])]
        result["split"] = split_rows(torch_ms)
        failures += [f"{key} {name}: {value}" for name, value in {**torch_ms, **result["jax"]}.items()
                     if isinstance(value, str)]
        failures += [f"{key} profile of {name}: " + (value if isinstance(value, str) else "no kernel recognized as "
                     "cuDNN's attention (fp8_api_profile.py's patterns need the new names)")
                     for name, value in result.get("profile", {}).items()
                     if isinstance(value, str) or not value["attention_kernels"]]
        missed += [f"{key} {row['road']} {row['pass_']}: {row['speedup']:.2f}x < {row['target']}x"
                   for row in result["rows"] if row["met"] is False]
        step = next(iter(result.get("profile", {}).values()), None)  # the FP8 step, FP8 backward
        if isinstance(step, dict) and step["other_share"] is not None and step["other_share"] > SHARE_TARGET:
            missed.append(f"{key} quantization and bookkeeping: {step['other_share']:.1%} > {SHARE_TARGET:.0%}")
    return failures, missed


def machine(args, core):
    """What the numbers were measured on and with."""
    try:
        commit = os.environ.get("FUSEDATTN_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    except OSError:  # no git on the machine
        commit = ""
    return dict(gpu="dry run (no GPU)" if args.dry_run else torch.cuda.get_device_name(),
                commit=commit.strip() or "unknown", torch=torch.__version__, build_info=core.build_info(),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                dry_run=args.dry_run, rounds=args.rounds, warmup=args.warmup, iters=args.iters)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build", help="the build whose python/ holds fusedattn (default: build)")
    parser.add_argument("--out", default="results", help="folder of the results (default: results)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), metavar="SHAPE",
                        help=f"some of {', '.join(SHAPES)} (b,s,h_q[/h_kv],d[,causal]; default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3, help="at least 3: a compiled FP8 call on a fresh "
                        "state compiles again after its first backward, which runs twice to measure")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--profile-calls", type=int, default=3, help="calls each profile covers (default: 3)")
    parser.add_argument("--no-split", action="store_true", help="skip the FP8 call split by batch entry")
    parser.add_argument("--no-profile", action="store_true", help="skip the kernel profile")
    parser.add_argument("--no-jax", action="store_true", help="skip the JAX road")
    parser.add_argument("--jax-timeout", type=int, default=240, help="seconds the JAX process may take")
    parser.add_argument("--dry-run", action="store_true", help="trace every call on meta tensors; time nothing")
    args = parser.parse_args()
    if args.warmup < 3:
        parser.error(f"--warmup {args.warmup}: at least 3 (see --help)")
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("run_bench_fp8_api.py needs a CUDA GPU (--dry-run checks the calls without one)")
    sys.path.insert(0, str(Path(args.build) / "python"))  # the build's fusedattn, before any installed one
    import fusedattn._core as core
    import fusedattn.torch as fa
    torch._dynamo.config.recompile_limit = 32  # a shape's compiled calls share code objects
    meta = machine(args, core)
    failures = [f"the kernel classifier misfiles {name!r}" for name in fp8_api_profile.misfiled_samples()]
    results = {}
    for key in args.shapes:
        print(f"== {key}", flush=True)
        try:
            results[key] = torch_shape(fa, SHAPES[key], args, "meta" if args.dry_run else "cuda")
        except Exception as error:  # noqa: BLE001  (a shape that fails hides none of the others)
            results[key] = dict(torch={})
            failures.append(f"{key}: PyTorch roads not measured: {short(error)}")
        print(json.dumps(results[key]["torch"]), flush=True)
        torch.cuda.empty_cache()  # what this shape held, before the next one and the JAX process
    jax_result = dict(ms={}, notes=[]) if args.no_jax else jax_road(args, args.shapes)
    meta.update(jax_result.get("meta", {}))
    failures += jax_result["notes"]  # fp8_api_jax.py notes only what it could not measure
    failed, missed = tabulate(results, jax_result["ms"])
    failures += failed
    notes = failures + (["JAX road skipped (--no-jax)"] if args.no_jax else [])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "bench-fp8-api"  # one name, overwritten each run
    targets = dict(speedup={k: dict(fwd=f, step=s) for k, (f, s) in TARGETS.items()}, other_share=SHARE_TARGET)
    (out / f"{stem}.json").write_text(json.dumps(dict(meta=meta, targets=targets, missed=missed, shapes=results,
                                                      notes=notes), indent=1))
    table = markdown(meta, results, notes + [f"target missed: {m}" for m in missed])
    (out / f"{stem}.md").write_text(table)
    print(table)
    print(f"dry run: {len(failures)} failures, nothing timed" if args.dry_run else
          "every target met" if not missed else f"targets NOT met: {len(missed)}", flush=True)
    sys.exit(1 if failures else 0)  # a missed target is a result; a number that could not be measured is not


if __name__ == "__main__":
    main()
