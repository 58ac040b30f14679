"""fusedattn.torch's C++ eager path (python/bindings/torch_ops.cpp: road 1 of __init__.py), compiled
against the PyTorch that is installed. A PyTorch extension binds to PyTorch's C++ ABI, which changes
with each release, so no module built in advance fits whichever PyTorch a user has.

The module is found, in order:
  1. beside the package, when it was built against this very PyTorch (the build tree's, or a wheel
     built with --no-build-isolation where this PyTorch was installed): a `_torch_ops.torch_version`
     file next to it names the version it was built against;
  2. in the cache, compiled earlier for this PyTorch, this fusedattn and this installation;
  3. compiled now, once, into the cache (one C++ file: about half a minute), under a file lock, so
     that processes started together (torchrun's ranks) compile it once between them.
Where it cannot be had, every call takes the general path (the same results, more host time per
call), and a warning says once what is missing and the one command that adds it.

FUSEDATTN_TORCH_FAST_PATH=0 leaves the module out; FUSEDATTN_CACHE_DIR moves the cache (default
~/.cache/fusedattn)."""
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path

import torch

from .. import __version__
from . import _fast_path_compile as _compile

_PACKAGE = Path(__file__).resolve().parent.parent  # fusedattn/


def _built_against(folder):
    """The PyTorch version the module in `folder` was built against, or None."""
    stamp = folder / "_torch_ops.torch_version"
    return stamp.read_text().strip() if stamp.is_file() else None


def _module_file(folder):
    found = sorted(folder.glob("_torch_ops.*.so")) + sorted(folder.glob("_torch_ops.so"))
    return found[0] if found else None


def _import(path):
    loader = importlib.machinery.ExtensionFileLoader("fusedattn._torch_ops", str(path))
    spec = importlib.util.spec_from_file_location("fusedattn._torch_ops", str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _cache_folder(sources):
    """One folder per (fusedattn, PyTorch, Python, installation, source): nothing built for another
    combination is ever loaded."""
    key = hashlib.sha256("\n".join([__version__, torch.__version__, sys.version, str(_PACKAGE)] +
                                   [p.read_text() for p in sources]).encode()).hexdigest()[:16]
    root = Path(os.environ.get("FUSEDATTN_CACHE_DIR") or Path.home() / ".cache" / "fusedattn")
    return root / "torch_ops" / f"torch-{torch.__version__}-{key}"


def _compiled(folder, plan):
    """The module compiled into `folder` (once, whoever holds the lock), or the reason it is not."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        target = folder / ("_torch_ops" + importlib.machinery.EXTENSION_SUFFIXES[0])
        if target.is_file():
            return target, None
        failed = folder / "failed.txt"
        if failed.is_file():  # a compile error does not change until the source or PyTorch does
            return None, failed.read_text()
        print(f"fusedattn: compiling fusedattn.torch's C++ path for PyTorch {torch.__version__} (once, about 30 s) "
              f"into {folder}", file=sys.stderr, flush=True)
        started = time.monotonic()
        partial = folder / f"partial-{os.getpid()}.so"
        error = _compile.run(plan, partial, log=folder / "compile.log")
        if error:
            failed.write_text(error)
            return None, error
        partial.rename(target)  # whole or not at all: a process that dies mid-compile leaves no module
        print(f"fusedattn: compiled in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        return target, None


def load():
    """The C++ eager path as a module, or None (after one warning saying why, where it was wanted)."""
    if os.environ.get("FUSEDATTN_TORCH_FAST_PATH", "1") == "0" or not torch.version.cuda:
        return None  # turned off, or a PyTorch without CUDA, where no call could take the path
    try:
        beside = _module_file(_PACKAGE)
        if beside is not None and _built_against(_PACKAGE) == torch.__version__:
            return _import(beside)
        plan, missing = _compile.plan(_PACKAGE)
        if missing:
            return _unavailable(missing)
        module_path, error = _compiled(_cache_folder(plan.sources), plan)
        if error:
            return _unavailable(error)
        return _import(module_path)
    except (OSError, ImportError) as error:  # an unwritable cache, a module that does not load
        return _unavailable(f"{type(error).__name__}: {error} (FUSEDATTN_CACHE_DIR moves the cache)")


_SHARED = []  # the process's one load()


def shared():
    """load()'s module (or None), loaded once per process: fusedattn.torch's calls and the calls that
    flex_attention composes (_flex_pieces.py) share it."""
    if not _SHARED:
        _SHARED.append(load())
    return _SHARED[0]


def _unavailable(reason):
    warnings.warn(f"fusedattn.torch runs without its C++ eager path (every call still works, with more host time "
                  f"per call): {reason}", RuntimeWarning, stacklevel=3)
    return None
