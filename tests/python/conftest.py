"""Python tier: the package from the build tree (build/python, made with -DFUSEDATTN_PYTHON=ON) or an
installed one. GPU tests skip without a usable CUDA device, PyTorch tests without PyTorch."""
import os
import sys
from pathlib import Path

build = Path(os.environ.get("FUSEDATTN_PYTHON_BUILD", Path(__file__).resolve().parents[2] / "build" / "python"))
if (build / "fusedattn").is_dir():
    sys.path.insert(0, str(build))


def pytest_collection_modifyitems(config, items):
    """FUSEDATTN_PYTEST_SHARD="i/n" keeps every n-th test from the i-th on: ctest runs a file whose
    tests each compile programs in child processes as n entries side by side (tests/CMakeLists.txt)."""
    shard = os.environ.get("FUSEDATTN_PYTEST_SHARD")
    if shard:
        index, count = (int(x) for x in shard.split("/"))
        config.hook.pytest_deselected(items=[item for position, item in enumerate(items) if position % count != index])
        items[:] = [item for position, item in enumerate(items) if position % count == index]
