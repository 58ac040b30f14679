"""The one compiler command behind fusedattn.torch's C++ eager path (_fast_path.py). Every piece it
needs is found first, so that what is missing is named, with the command that adds it, before
anything runs: a C++ compiler, Python's headers, PyTorch's headers and libraries, the CUDA runtime's
headers and library (the nvidia-cuda-runtime package PyTorch brings, or a CUDA toolkit), and
fusedattn's own source, headers and library, which the package carries for this purpose."""
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import torch


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the command compiles and links: `sources[0]` is the module's one translation unit, the
    rest what it includes of fusedattn's (they key the cache)."""
    compiler: str
    sources: tuple
    include_dirs: tuple
    system_include_dirs: tuple
    libraries: tuple  # (folder, -l name) pairs, each folder also the module's runpath
    cxx11_abi: int

    def command(self, output):
        return ([self.compiler, "-O2", "-std=gnu++20", "-shared", "-fPIC", "-fvisibility=hidden",
                 f"-D_GLIBCXX_USE_CXX11_ABI={self.cxx11_abi}", "-DTORCH_EXTENSION_NAME=_torch_ops"]
                + [f"-I{d}" for d in self.include_dirs]
                + [arg for d in self.system_include_dirs for arg in ("-isystem", str(d))]
                + [str(self.sources[0]), "-o", str(output)]
                + [arg for folder, name in self.libraries for arg in (f"-L{folder}", f"-l{name}")]
                + [f"-Wl,-rpath,{folder}" for folder in dict.fromkeys(folder for folder, _ in self.libraries)])


def _toolkit_major(root):
    """The major version of the CUDA toolkit at `root` (from include/cuda_runtime_api.h), or None."""
    header = root / "include" / "cuda_runtime_api.h"
    if not header.is_file():
        return None
    for line in header.read_text(errors="replace").splitlines():
        if line.startswith("#define CUDART_VERSION"):
            return str(int(line.split()[2]) // 1000)
    return None


def _cuda_runtime():
    """(include folder, library folder, -l name) of the CUDA runtime PyTorch was built with: a CUDA
    toolkit's of that major version where there is one (CUDA_HOME, CUDA_PATH, /usr/local/cuda: what
    PyTorch's own extensions compile against), else the nvidia-cuda-runtime package's
    (nvidia/cu<major>, which PyTorch's wheel brings)."""
    major = torch.version.cuda.split(".")[0]
    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots.append(Path("/usr/local/cuda"))
    roots = [r for r in roots if _toolkit_major(r) == major]
    spec = importlib.util.find_spec("nvidia")
    if spec is not None:
        roots += [Path(p) / f"cu{major}" for p in spec.submodule_search_locations]
    for root in roots:
        for lib in ("lib", "lib64"):
            found = sorted((root / lib).glob("libcudart.so*"))
            if (root / "include" / "cuda_runtime_api.h").is_file() and found:
                return root / "include", root / lib, ":" + found[0].name
    return None


def plan(package):
    """(Plan, None) or (None, what is missing and the one command that adds it)."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        return None, "no C++ compiler found (g++, c++ or $CXX); add one: apt-get install g++"
    python_include = Path(sysconfig.get_paths()["include"])
    if not (python_include / "Python.h").is_file():
        version = sysconfig.get_python_version()
        return None, (f"Python's headers are missing (no Python.h in {python_include}); add them: "
                      f"apt-get install python{version}-dev")
    cuda = _cuda_runtime()
    if cuda is None:
        major = torch.version.cuda.split(".")[0]
        return None, (f"the CUDA {major} runtime's headers are missing (cuda_runtime_api.h, libcudart); add them: "
                      f"pip install 'nvidia-cuda-runtime=={major}.*'")
    source = package / "_torch_ops_src"
    # The wheel carries libfusedattn.so beside the package's modules; the build tree, one folder up.
    library = next((d for d in (package, package.parent.parent) if (d / "libfusedattn.so").is_file()), None)
    own = [source / name for name in ("torch_ops.cpp", "python_errors.h", "torch_tensors.h", "torch_workspace.h",
                                      "torch_backward_node.h", "torch_paged.h", "torch_plain_call.h", "torch_prefix.h")]
    pieces = own + [package / "include" / "fusedattn"]
    absent = [str(p) for p in pieces if not p.exists()] + ([] if library else ["libfusedattn.so"])
    if absent:
        return None, (f"this fusedattn installation lacks {', '.join(absent)}; reinstall it: "
                      f"pip install --force-reinstall --no-deps fusedattn")
    torch_dir = Path(torch.__file__).resolve().parent
    headers = sorted((package / "include" / "fusedattn").glob("*.h"))
    return Plan(compiler=compiler, sources=(*own, *headers),
                include_dirs=(package / "include", source),
                system_include_dirs=(torch_dir / "include", torch_dir / "include" / "torch" / "csrc" / "api" / "include",
                                     python_include, cuda[0]),
                libraries=((torch_dir / "lib", "c10"), (torch_dir / "lib", "c10_cuda"), (torch_dir / "lib", "torch_cpu"),
                           (torch_dir / "lib", "torch_cuda"), (torch_dir / "lib", "torch_python"),
                           (library, "fusedattn"), (cuda[1], cuda[2])),
                cxx11_abi=int(torch._C._GLIBCXX_USE_CXX11_ABI)), None


def run(plan, output, *, log):
    """Compiles `plan` into `output`; None, or why it failed (its log kept at `log`)."""
    command = plan.command(output)
    done = subprocess.run(command, capture_output=True, text=True)
    log.write_text(" ".join(command) + "\n\n" + done.stdout + done.stderr)
    if done.returncode == 0:
        return None
    first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:300])
    return (f"compiling it against PyTorch {torch.__version__} with {plan.compiler} failed: {first} (the whole log: "
            f"{log}; after fixing, delete {output.parent} to compile again)")
