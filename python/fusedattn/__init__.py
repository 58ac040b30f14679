"""fusedattn: fused attention on NVIDIA GPUs through cuDNN's graph API.

One C++ core builds the cuDNN graphs, answers "supported, and if not, why", caches compiled plans
and runs them. This package imports without PyTorch or JAX; `import fusedattn.torch` needs PyTorch.

    import fusedattn
    fusedattn.check_support("layout=bshd b=2 s=4096 h=16 d=128 causal", "backward")
"""
from .errors import (CudaError, CudnnError, FusedAttnError, InvalidArgumentError, NotSupportedError,
                     SetupError, invalid_argument)

__version__ = "0.1.0"
__all__ = ["FusedAttnError", "InvalidArgumentError", "NotSupportedError", "CudnnError", "CudaError", "SetupError",
           "Spec", "Config", "Pass", "Support", "check_support", "build_info", "plan_cache_stats", "set_autotune",
           "plan_dir", "set_plan_dir", "default_plan_dir", "disk_cache_stats", "reset_disk_cache_stats", "warm_up",
           "ragged_buckets"]

# Plans across processes (the C++ headers fusedattn/disk_cache.h, autotune.h and warmup.h say more):
# set_plan_dir(folder) ('' turns the disk cache off; FUSEDATTN_PLAN_DIR sets it at start-up),
# set_autotune(True) (FUSEDATTN_AUTOTUNE=1) for every adapter's plans, warm_up() ahead of time.
_CORE_NAMES = ("Spec", "Config", "Pass", "Plan", "get_plan", "build_info", "plan_cache_stats", "set_autotune",
               "plan_dir", "set_plan_dir", "default_plan_dir", "disk_cache_stats", "reset_disk_cache_stats")


def _load_core():
    """The compiled module, loaded on first use (it brings the CUDA runtime and cuDNN with it)."""
    from . import _core as core
    return core


def __getattr__(name):  # fusedattn.Spec and friends come from the compiled module, lazily
    if name in _CORE_NAMES:
        return getattr(_load_core(), name)
    raise AttributeError(f"module 'fusedattn' has no attribute {name!r}")


def _pass_of(core, pass_):
    if isinstance(pass_, str):
        if pass_ not in core.Pass.__members__:
            raise invalid_argument("pass", pass_, "forward or backward")
        return core.Pass.__members__[pass_]
    return pass_


def _spec_of(core, spec):
    return core.Spec.parse(spec) if isinstance(spec, str) else spec


def warm_up(specs, passes=("forward", "backward"), threads=0, autotune=None):
    """Builds (or restores from the disk cache) the plan of every spec for every pass, `threads` at a
    time (0: the machine's, at most 8), before a training or serving loop needs them. Specs are
    strings or Specs; autotune=None takes the process default. Returns [(spec string, pass, ok,
    message, ms)], message saying why where not ok."""
    core = _load_core()
    return core.warm_up([_spec_of(core, s) for s in specs], [_pass_of(core, p) for p in passes], threads, autotune)


def ragged_buckets(spec):
    """Every bucketed spec (as strings) a ragged training loop up to `spec`'s batch and longest
    sequences can meet: what warm_up needs to build so that such a loop never waits for a plan."""
    core = _load_core()
    return [str(s) for s in core.ragged_buckets(_spec_of(core, spec))]


class Support(tuple):
    """check_support's answer. It unpacks as (ok, reasons), each reason (field, value, requirement,
    lifted_by), so `ok, reasons = check_support(...)` reads it; `ok` and `reasons` name the parts.
    `policy_only` is "" where cuDNN's own check ran (or the policy's refusal settled it); else it
    says which device and cuDNN the policy answered for and why cuDNN did not check ("policy for SM
    9.0 with cuDNN 9.19.0 only, cuDNN's own check not run (no NVIDIA driver found)"). str() is
    every reason, one a line, then that note: the C++ Support::to_string(). `fp8_backward`, for the
    backward of an FP8 spec, says which backward fp8_attention's backward="auto" takes after its FP8
    forward: "fp8" or "model" where this process measured it, else "not measured"; "" otherwise.
    `kernel` says which kernels run a supported call where cuDNN's check ran ("cuDNN", "cuDNN split
    decode, 32 chunks of 4 pages", "fusedattn decode kernel, 32 chunks of 256 keys merged"); ""
    otherwise."""

    def __new__(cls, ok, reasons, policy_only, text, kernel="", fp8_backward=""):
        answer = super().__new__(cls, (ok, reasons))
        answer.policy_only, answer._text, answer.kernel = policy_only, text, kernel
        answer.fp8_backward = fp8_backward
        return answer

    ok = property(lambda self: self[0])
    reasons = property(lambda self: self[1])

    def __str__(self):
        return self._text


def check_support(spec, pass_="forward", device=None):
    """Whether a spec string or Spec runs, and if not every reason why: a Support, which unpacks as
    (ok, reasons), each reason (field, value, requirement, lifted_by).

    device=None asks the current GPU: the policy, then cuDNN's own check (which builds and caches
    the plan). In a process with no GPU (no NVIDIA driver, or none it sees) the answer is the
    policy's for SM 9.0 instead of a CudaError. device="sm90" (or "sm80", "sm100", "sm120", ...)
    asks the policy about that device, with or without a GPU here. Either way the answer's
    policy_only says that cuDNN's own check did not run, and why."""
    core = _load_core()
    spec, pass_ = _spec_of(core, spec), _pass_of(core, pass_)
    fp8_backward = core.fp8_backward_report(spec) if pass_ == core.Pass.backward and device is None else ""
    return Support(*core.check_support(spec, pass_, device), fp8_backward=fp8_backward)
