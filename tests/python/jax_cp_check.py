"""What the JAX context-parallel tests' child processes share: CHECK, the start of every child
program (a test file's CHILD is CHECK and its own stand-in kernels and configurations), and the
running of a child on 4 host devices with the reading of its "label NAME value" lines."""
import json
import os
import subprocess
import sys

# What both children share: for each configuration its program (output and gradients at once) and
# its reference's, in float32. A child gives `check` its `ours` and `whole` for the configuration;
# REFERENCES keeps one answer per set of inputs (`key`), since every scheme and layout must give it.
CHECK = r"""
import functools, json, sys
import jax, jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec as P
import fusedattn.jax as fj
from fusedattn import _config, _context_parallel as _cp
from fusedattn.jax._calls import BACKWARD, FORWARD
from fusedattn.jax._kernels import KERNELS

CONFIGS = json.loads(sys.argv[1])  # {label: its settings}
REFERENCES = {}
CALLS = []


def value_and_grads(f, w, with_sink):
    def loss(q, k, v, sink):
        out = f(q, k, v, sink)
        return (out.astype(jnp.float32) * w).sum(), out
    return jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3) if with_sink else (0, 1, 2), has_aux=True))


def check(label, ours, whole, key, with_sink, q, k, v, w, sink):
    # Prints the errors; returns the compiled program's text. Traced (CALLS filled) while lowering.
    CALLS.clear()
    step = value_and_grads(ours, w, with_sink).lower(q, k, v, sink).compile()
    (_, out), grads = step(q, k, v, sink)
    if key not in REFERENCES:
        REFERENCES[key] = value_and_grads(whole, w, with_sink)(q, k, v, sink)
    (_, ref), ref_grads = REFERENCES[key]
    rel = lambda a, b: float(jnp.linalg.norm(a.astype(jnp.float32) - b) / jnp.linalg.norm(b))
    print(label, "OUT_ERR", rel(out, ref))
    print(label, "GRAD_ERR", max(rel(g, r) for g, r in zip(grads, ref_grads)))
    return step.as_text()


def visible_window(i, j, left, right):  # the window (L, R) from the top-left: i - L < j <= i + R, -1 no bound
    return ((j > i - left) if left >= 0 else True) & ((j <= i + right) if right >= 0 else True)
"""

# The children's programs run once on a few thousand elements, and compiling them was nearly all of
# this file's time: LLVM's optimization of the host code halves it (7 s a program to 4) and changes
# nothing the tests look at (the HLO, its collectives, the values to float32 rounding).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def run_program(program, *args):
    """`program` in a child process on 4 host devices: its stdout."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4 " + FAST_COMPILE,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # faulthandler: a crash of the child (JAX 0.11.2's host collectives died with SIGSEGV on the
    # GPU machine) leaves its Python stack in stderr, which the assertion shows.
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", program, *args], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def run_configs(configs, program):
    """A context-parallel child (`program`: a test file's CHILD) checking every configuration of
    `configs`, {label: (scheme, causal, balanced, h_kv, with_sink, window)}: {label: its "NAME
    value" lines as a dict}, and the child's stdout."""
    settings = {label: dict(zip(("scheme", "causal", "balanced", "h_kv", "sink", "window"), c))
                for label, c in configs.items()}
    out = run_program(program, json.dumps(settings))
    lines = {label: {} for label in configs}
    for line in out.splitlines():
        label, name, value = line.split(" ", 2)
        lines[label][name] = value
    return lines, out


def assert_close(lines, out):
    # bfloat16 inputs, blocks merged in float32 and rounded to bfloat16 once per partial; GRAD_ERR
    # includes the sink's gradient where there is a sink.
    assert float(lines["OUT_ERR"]) < 1e-2 and float(lines["GRAD_ERR"]) < 2e-2, out


NO_WINDOW = (-1, -1)
