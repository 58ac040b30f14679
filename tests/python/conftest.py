"""Python tier: the package from the build tree (build/python, made with -DFUSEDATTN_PYTHON=ON) or an
installed one. GPU tests skip without a usable CUDA device, PyTorch tests without PyTorch."""
import os
import sys
from pathlib import Path

build = Path(os.environ.get("FUSEDATTN_PYTHON_BUILD", Path(__file__).resolve().parents[2] / "build" / "python"))
if (build / "fusedattn").is_dir():
    sys.path.insert(0, str(build))
