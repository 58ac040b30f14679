#!/usr/bin/env python3
"""bench/fp8_api_jax.py — the JAX road of run_bench_fp8_api.py, in a process of its own (JAX's and
PyTorch's CUDA libraries and memory pools stay apart, and a crash here leaves the PyTorch numbers):
fusedattn.jax.fp8_attention with a delayed-scaling state threaded from call to call, beside
fusedattn.jax.attention in BF16, under jax.jit on the same arrays. A forward returns O; a training
step is jax.vjp with a fixed dO, returning dQ, dK, dV (and, for FP8, the state's cotangent, which is
the next step's state: fusedattn.jax._fp8_attention's docstring).

    python bench/fp8_api_jax.py --build build --shapes 2,8192,16,128,causal   # JSON on the last line

Timing: each jitted call `iters` times back to back, blocked on once (block_until_ready), host clock
around the loop: with asynchronous dispatch the GPU runs the calls back to back, so at these sizes it
is GPU time (as bench/run_bench_jax.py times); rounds interleave the calls, and the median over
rounds is reported. --dry-run exports each program for CUDA instead (jax.export), which needs no GPU.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before JAX starts: it shares the GPU
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from run_bench_jax import parse_shape  # noqa: E402

# The FFI targets the exported programs call (jax.export refuses custom calls it does not know).
FFI_TARGETS = ("fusedattn_forward", "fusedattn_backward")


def cases(fj, shape, q, k, v, d_o):
    """name -> (a jitted function, its arguments before the state, its fresh state or None). Each
    returns (outputs, state); the state of one call is the next call's."""
    causal = shape["causal"]

    def bf16_forward(q, k, v, state):
        return fj.attention(q, k, v, causal=causal), state

    def bf16_step(q, k, v, d_o, state):
        _, pullback = jax.vjp(lambda q, k, v: fj.attention(q, k, v, causal=causal), q, k, v)
        return pullback(d_o), state

    def fp8_forward(q, k, v, state):
        return fj.fp8_attention(q, k, v, state, causal=causal)

    def fp8_step(backward):
        def step(q, k, v, d_o, state):
            _, pullback = jax.vjp(lambda q, k, v, s: fj.fp8_attention(q, k, v, s, causal=causal, backward=backward)[0],
                                  q, k, v, state)
            d_q, d_k, d_v, state = pullback(d_o)  # the state's cotangent is the state after the step
            return (d_q, d_k, d_v), state
        return step

    fresh = lambda: fj.fp8_state("delayed")  # noqa: E731  (one state a call, as one per attention layer)
    return {("bf16", "fwd"): (jax.jit(bf16_forward), (q, k, v), None),
            ("fp8", "fwd"): (jax.jit(fp8_forward), (q, k, v), fresh()),
            ("bf16", "step"): (jax.jit(bf16_step), (q, k, v, d_o), None),
            ("fp8", "step"): (jax.jit(fp8_step("fp8")), (q, k, v, d_o), fresh()),
            ("fp8 model bwd", "step"): (jax.jit(fp8_step("model")), (q, k, v, d_o), fresh())}


def loop_ms(fn, args, state, iters):
    """ms a call of `iters` calls back to back, the state threaded; and the state after them."""
    start = time.perf_counter()
    for _ in range(iters):
        out, state = fn(*args, state)
    jax.block_until_ready((out, state))
    return (time.perf_counter() - start) * 1e3 / iters, state


def exported(fn, args, state):
    """The program exported for CUDA from abstract arrays: traced and lowered, not run."""
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (args, state))
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in FFI_TARGETS]
    jax.export.export(fn, platforms=["cuda"], disabled_checks=checks)(*abstract[0], abstract[1])


def said(error):
    """An error's type and first line (XLA's messages run to pages)."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"


def shape_ms(fj, shape, args):
    """{"<call>|<pass>": ms or an error's text} of one shape."""
    keys = jax.random.split(jax.random.key(0), 4)
    b, s, d = shape["b"], shape["s"], shape["d"]
    arrays = [jax.random.uniform(key, (b, s, h, d), jnp.float32, -1, 1).astype(jnp.bfloat16)
              for key, h in zip(keys, (shape["h_q"], shape["h_kv"], shape["h_kv"], shape["h_q"]))]
    out, live, times = {}, {}, {}
    for (name, pass_), (fn, fn_args, state) in cases(fj, shape, *arrays).items():
        key = f"{name}|{pass_}"
        try:
            if args.dry_run:
                exported(fn, fn_args, state)
                out[key] = None
                continue
            for _ in range(args.warmup):  # compiles, and a fresh FP8 state's first backward measures
                _, state = fn(*fn_args, state)
            jax.block_until_ready(state)
            live[key], times[key] = (fn, fn_args, state), []
        except Exception as error:  # noqa: BLE001  (one failing call hides none of the others)
            out[key] = said(error)
            print(f"fp8_api_jax: {shape['key']} {key}: {out[key]}", file=sys.stderr, flush=True)
    for _ in range(args.rounds):
        for key, (fn, fn_args, state) in list(live.items()):
            if key in out:
                continue  # failed in an earlier round
            try:
                ms, state = loop_ms(fn, fn_args, state, args.iters)
                times[key].append(ms)
                live[key] = (fn, fn_args, state)
            except Exception as error:  # noqa: BLE001
                out[key] = said(error)
    out.update({key: statistics.median(t) for key, t in times.items() if key not in out})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--shapes", nargs="+", required=True, help="b,s,h_q[/h_kv],d[,causal] each")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--dry-run", action="store_true", help="export each program for CUDA; run nothing")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.build) / "python"))
    result = dict(meta=dict(jax=jax.__version__), ms={}, notes=[])
    try:
        import fusedattn.jax as fj
        device = jax.devices()[0]
        result["meta"]["jax_device"] = device.device_kind
        if device.platform != "gpu" and not args.dry_run:
            raise RuntimeError(f"JAX sees no GPU (its first device is {device.platform}); --dry-run needs none")
    except Exception as error:  # noqa: BLE001  (said in the results, not a crash of the whole benchmark)
        result["notes"].append(f"JAX road not measured: {said(error)}")
        print(json.dumps(result))
        return
    for key in args.shapes:
        shape = parse_shape(key)
        result["ms"][key] = shape_ms(fj, shape, args)
        print(f"fp8_api_jax: {key}: {json.dumps(result['ms'][key])}", file=sys.stderr, flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
