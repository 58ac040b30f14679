"""fusedattn's exceptions: one class per kind of core error (fusedattn/errors.h), importable
without the compiled module, PyTorch or JAX."""


class FusedAttnError(Exception):
    """Base of every fusedattn error; str() is the core's full message (with the spec string)."""


class InvalidArgumentError(FusedAttnError, ValueError):
    """Bad input, raised before any GPU work; `field`, `value` and `requirement` say what and why."""

    field = value = requirement = None


class NotSupportedError(FusedAttnError):
    """Valid, but this GPU and cuDNN cannot run it; the message lists every reason."""


class CudnnError(FusedAttnError, RuntimeError):
    """A cuDNN call failed: the call, its status and the spec."""


class CudaError(FusedAttnError, RuntimeError):
    """A CUDA runtime call failed."""


class SetupError(FusedAttnError, RuntimeError):
    """A library is missing, or compile-time and run-time versions disagree."""
