"""fusedattn.torch's C++ eager path compiled for the installed PyTorch (fusedattn/torch/_fast_path.py):
every piece found or named with the command that adds it, the module compiled once into the cache
and loaded from it, a compile failure kept and reported, and the switches. No GPU needed: the
compiled module is loaded and called with CPU tensors, which it hands back to the general path."""
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.version.cuda:
    pytest.skip("a PyTorch without CUDA has no C++ eager path", allow_module_level=True)
import fusedattn.torch as ft  # noqa: E402
from fusedattn.torch import _fast_path, _fast_path_compile  # noqa: E402

PACKAGE = Path(ft.__file__).resolve().parent.parent


def test_every_piece_is_found_in_this_package():
    plan, missing = _fast_path_compile.plan(PACKAGE)
    assert missing is None
    assert plan.sources[0].name == "torch_ops.cpp" and all(Path(p).is_file() for p in plan.sources)
    assert any(name == "fusedattn" for _, name in plan.libraries)
    assert any(str(name).startswith(":libcudart.so") or name == "cudart" for _, name in plan.libraries)


@pytest.mark.parametrize("what, patch, words", [
    ("compiler", lambda m: (m.setenv("CXX", ""), m.setattr(_fast_path_compile.shutil, "which", lambda name: None)),
     ["no C++ compiler", "apt-get install g++"]),
    ("python headers", lambda m: m.setattr(_fast_path_compile.sysconfig, "get_paths", lambda: {"include": "/nowhere"}),
     ["Python.h in /nowhere", "-dev"]),
    ("cuda runtime", lambda m: m.setattr(_fast_path_compile, "_cuda_runtime", lambda: None),
     ["cuda_runtime_api.h", "pip install 'nvidia-cuda-runtime=="]),
])
def test_a_missing_piece_is_named_with_the_command_that_adds_it(monkeypatch, what, patch, words):
    patch(monkeypatch)
    plan, missing = _fast_path_compile.plan(PACKAGE)
    assert plan is None
    for word in words:
        assert word in missing, (what, missing)


def test_a_package_without_the_source_says_to_reinstall(tmp_path):
    plan, missing = _fast_path_compile.plan(tmp_path)
    assert plan is None and "torch_ops.cpp" in missing and "pip install --force-reinstall" in missing


def test_compiled_once_into_the_cache_then_loaded_from_it(tmp_path):
    plan, _ = _fast_path_compile.plan(PACKAGE)
    folder = tmp_path / "torch_ops"
    module, error = _fast_path._compiled(folder, plan)
    log = folder / "compile.log"
    assert error is None, log.read_text()[-4000:] if log.is_file() else error
    assert module.is_file() and not list(folder.glob("partial-*"))
    built = module.stat().st_mtime_ns
    started = time.monotonic()
    assert _fast_path._compiled(folder, plan) == (module, None)
    assert time.monotonic() - started < 1 and module.stat().st_mtime_ns == built  # not compiled again
    # Loaded in a process of its own (this one holds the package's module): a call on CPU tensors is
    # handed back to the general path, so the module loaded, resolved its symbols and ran.
    check = (
        "import torch, fusedattn.torch as ft\n"
        "from fusedattn.torch import _fast_path\n"
        f"m = _fast_path._import({str(module)!r})\n"
        "q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)\n"
        "config = ft._plain_config_id('bshd', False, (-1, -1), 'top_left', False, 'vanilla', False)\n"
        "assert m.forward(q, q, q, config, None) is NotImplemented\n")
    path = os.pathsep.join(filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path))
    assert done.returncode == 0, done.stderr


def test_a_compile_failure_is_kept_and_said_without_compiling_again(tmp_path):
    plan, _ = _fast_path_compile.plan(PACKAGE)
    broken = dataclasses.replace(plan, compiler="false")  # `false`: a compiler that always fails
    folder = tmp_path / "torch_ops"
    module, error = _fast_path._compiled(folder, broken)
    assert module is None and "failed" in error and str(folder / "compile.log") in error
    log = (folder / "compile.log").stat().st_mtime_ns
    assert _fast_path._compiled(folder, broken) == (None, error)
    assert (folder / "compile.log").stat().st_mtime_ns == log


def test_a_module_built_against_another_pytorch_is_not_loaded(monkeypatch, tmp_path):
    monkeypatch.setattr(_fast_path, "_built_against", lambda folder: "1.0.0")
    monkeypatch.setattr(_fast_path, "_compiled", lambda folder, plan: (None, "compiled elsewhere"))
    with pytest.warns(RuntimeWarning, match="compiled elsewhere"):
        assert _fast_path.load() is None


def test_an_unwritable_cache_is_said_and_every_call_still_works(monkeypatch, tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("FUSEDATTN_CACHE_DIR", str(not_a_folder))
    monkeypatch.setattr(_fast_path, "_built_against", lambda folder: None)  # as if built for another PyTorch
    with pytest.warns(RuntimeWarning, match="FUSEDATTN_CACHE_DIR"):
        assert _fast_path.load() is None


def test_turned_off_or_without_cuda_there_is_no_module(monkeypatch):
    monkeypatch.setenv("FUSEDATTN_TORCH_FAST_PATH", "0")
    assert _fast_path.load() is None
    monkeypatch.delenv("FUSEDATTN_TORCH_FAST_PATH")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert _fast_path.load() is None
