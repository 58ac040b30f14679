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


def shown_value(value):
    """`value` as a message shows it, by the core's rule (shown_value in fusedattn/errors.h): whole
    up to 200 characters, else its first 150, " ... ", its last 50 and its length."""
    text = str(value)
    if len(text) <= 200:
        return text
    return f"{text[:150]} ... {text[-50:]} ({len(text)} characters)"


def invalid_argument(field, value, requirement):
    """An InvalidArgumentError raised by the adapters themselves, formed as the core forms its own
    ("field = value: requirement", a long value shown cut) and carrying the three parts whole."""
    error = InvalidArgumentError(f"{field} = {shown_value(value)}: {requirement}")
    error.field, error.value, error.requirement = field, str(value), requirement
    return error
