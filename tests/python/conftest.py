"""Python tier: the package from the build tree (build/python, made with -DFUSEDATTN_PYTHON=ON) or an
installed one. GPU tests skip without a usable CUDA device, PyTorch tests without PyTorch."""
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

build = Path(os.environ.get("FUSEDATTN_PYTHON_BUILD", Path(__file__).resolve().parents[2] / "build" / "python"))
if (build / "fusedattn").is_dir():
    sys.path.insert(0, str(build))

# XLA's programs here are the tests' references and glue, each compiled once and run once or twice:
# autotuning their matrix products (cuBLAS algorithms, Triton tilings) took seconds per program and
# changes nothing a test checks. Set before any test module imports JAX, unless the caller chose.
if "xla_gpu_autotune_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()

# How this session's tests ended, for pytest_sessionfinish.
outcomes = Counter()


def pytest_collection_modifyitems(config, items):
    """FUSEDATTN_PYTEST_SHARD="i/n" keeps every n-th test from the i-th on: ctest runs a file whose
    tests each compile programs in child processes as n entries side by side (tests/CMakeLists.txt)."""
    shard = os.environ.get("FUSEDATTN_PYTEST_SHARD")
    if shard:
        index, count = (int(x) for x in shard.split("/"))
        config.hook.pytest_deselected(items=[item for position, item in enumerate(items) if position % count != index])
        items[:] = [item for position, item in enumerate(items) if position % count == index]


def pytest_runtest_logreport(report):
    # A test skipped in setup (a skip mark, a missing GPU) never reaches "call".
    if report.passed and report.when == "call":
        outcomes["passed"] += 1
    elif report.skipped:
        outcomes["skipped"] += 1


def pytest_sessionfinish(session, exitstatus):
    """A run in which every test skipped exits 5, as pytest does when it collects none: ctest maps 5 to
    skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt), where exit 0 would have counted a file that
    tested nothing as passed. Failures and errors keep their own status."""
    if exitstatus == pytest.ExitCode.OK and outcomes["skipped"] and not outcomes["passed"]:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
