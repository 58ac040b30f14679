"""fusedattn: fused attention on NVIDIA GPUs through cuDNN's graph API.

One C++ core builds the cuDNN graphs, answers "supported, and if not, why", caches compiled plans
and runs them. This package imports without PyTorch or JAX; `import fusedattn.torch` needs PyTorch.

    import fusedattn
    fusedattn.check_support("layout=bshd b=2 s=4096 h=16 d=128 causal", "backward")
"""
from .errors import (CudaError, CudnnError, FusedAttnError, InvalidArgumentError, NotSupportedError,
                     SetupError)

__version__ = "0.1.0"
__all__ = ["FusedAttnError", "InvalidArgumentError", "NotSupportedError", "CudnnError", "CudaError", "SetupError",
           "Spec", "Config", "Pass", "check_support", "build_info", "plan_cache_stats"]


def _load_core():
    """The compiled module, loaded on first use (it brings the CUDA runtime and cuDNN with it)."""
    from . import _core as core
    return core


def __getattr__(name):  # fusedattn.Spec and friends come from the compiled module, lazily
    if name in ("Spec", "Config", "Pass", "Plan", "get_plan", "build_info", "plan_cache_stats"):
        return getattr(_load_core(), name)
    raise AttributeError(f"module 'fusedattn' has no attribute {name!r}")


def check_support(spec, pass_="forward"):
    """(supported, reasons) on the current GPU for a spec string or Spec: the policy, then cuDNN's own
    check. Each reason is (field, value, requirement, lifted_by)."""
    core = _load_core()
    if isinstance(pass_, str):
        if pass_ not in core.Pass.__members__:
            from .errors import invalid_argument
            raise invalid_argument("pass", pass_, "forward or backward")
        pass_ = core.Pass.__members__[pass_]
    ok, reasons, _ = core.check_support(core.Spec.parse(spec) if isinstance(spec, str) else spec, pass_)
    return ok, reasons
