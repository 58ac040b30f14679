"""Probe on the GPU machine: JAX 0.11.2's CPU compiler dies (SIGSEGV) on most of the dense
context-parallel children of tests/python/test_jax_context_parallel.py, while the packed ones and
one windowed one pass (JAX 0.10.2 passes them all). Runs four children; with --flags, one of
them under a few XLA options, and once with HLO dumps after every pass, whose last files name the
pass it died in.

    PYTHONPATH=build-gpu/python python3 scripts/probe_jax_cp_crash.py
"""
import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests" / "python" / "test_jax_context_parallel.py"


def _child_program():
    """The test file's CHILD (with the REPORT it is built from), without importing the test module."""
    names = {}
    for node in ast.parse(TESTS.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("REPORT", "CHILD"):
            exec(compile(ast.Module([node], []), str(TESTS), "exec"), names)
    return names["CHILD"]


CHILD = _child_program()
ARGS = ["ring", "1", "1", "4", "0", "-1,-1"]  # test_outputs_and_gradients_equal_the_whole_sequences[mha-causal_balanced-ring]


def child(flags, args=ARGS):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=" ".join(["--xla_force_host_platform_device_count=4"] + flags))
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD, *args], env=env, capture_output=True,
                          text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if "rror" in line][:2]
    out = [line for line in done.stdout.splitlines() if line.startswith(("OUT_ERR", "GRAD_ERR"))]
    print(f"rc {done.returncode:4}  flags {' '.join(flags) or '(none)'}  args {' '.join(args)}  {out} {errors}", flush=True)


if __name__ == "__main__":
    import jax
    print("jax", jax.__version__, flush=True)
    child([])
    child([], ["all_gather", "0", "0", "2", "0", "-1,-1"])  # not causal, all-gather, GQA
    child([], ["ring", "1", "1", "2", "1", "-1,-1"])  # a sink
    child([], ["ring", "0", "0", "2", "0", "5,40"])  # a two-sided window
    if "--flags" not in sys.argv:
        sys.exit(0)
    for flags in (["--xla_backend_optimization_level=0"], ["--xla_cpu_use_thunk_runtime=false"],
                  ["--xla_cpu_enable_fast_math=false"], ["--xla_cpu_parallel_codegen_split_count=1"]):
        child(flags)
    with tempfile.TemporaryDirectory() as dump:
        child([f"--xla_dump_to={dump}", "--xla_dump_hlo_pass_re=.*"])
        files = sorted(Path(dump).iterdir(), key=lambda f: f.stat().st_mtime_ns)
        print(f"{len(files)} dump files; the last:", flush=True)
        for f in files[-6:]:
            print("  ", f.name, flush=True)
