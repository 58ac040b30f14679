"""The FP8 scaling recipes' framework-free parts, shared by fusedattn.torch and fusedattn.jax: the
tensors a state scales (in slot order), which of them the kernels write, their headroom, the
recipe's checks, and which histories a step moves. Each adapter keeps only its arrays and kernels.
"""
from .errors import invalid_argument

# A state's slots: a scale, a descale, an amax and an amax history per tensor.
TENSORS = ("q", "k", "v", "s", "o", "d_o", "d_p", "d_q", "d_k", "d_v")
SLOT = {name: i for i, name in enumerate(TENSORS)}
# Delayed under both recipes: the kernels write these, so nothing can measure them first. Their
# scales keep two bits of headroom over the amax history, so that a step whose gradients outgrow
# the history does not saturate (FP8 is floating point: the headroom costs no relative precision
# above the subnormals). Without it, dV saturated on the H200 in a third step of fresh inputs.
KERNEL_WRITTEN = ("d_p", "d_q", "d_k", "d_v")
HEADROOM_BITS = 2

# A state's formats, by the name the adapters' operators carry: the format of the forward's tensors
# (Q, K, V, S, O) and of the backward's (dO, dP, dQ, dK, dV). "hybrid" is FP8 training's usual
# choice: E4M3 forward, E5M2 gradients, which need range (57344 against 448) more than precision.
FORMATS = {"e4m3": ("e4m3", "e4m3"), "e5m2": ("e5m2", "e5m2"), "hybrid": ("e4m3", "e5m2")}
GRADIENTS = ("d_o", "d_p", "d_q", "d_k", "d_v")


def format_name(forward, gradients):
    """The name of the format of these two dtype names ("e4m3", "e5m2"), or None where there is none
    (the adapters raise, in their dtypes' words)."""
    return next((name for name, pair in FORMATS.items() if pair == (forward, gradients)), None)


def dtype_name(tensor, format):
    """The dtype name of `tensor`'s slot ("q", "d_o", ...) in a state of `format`."""
    return FORMATS[format][1 if tensor in GRADIENTS else 0]


def fp8_grads(format):
    """The config option of a state of `format`'s FP8 backward: "e5m2" for hybrid, else none ("")."""
    return "e5m2" if format == "hybrid" else ""


def margin_of(name, margin):
    """The margin (scale divided by 2^margin) of `name`'s scale in a state of `margin`."""
    return margin + (HEADROOM_BITS if name in KERNEL_WRITTEN else 0)


def require_recipe(recipe):
    """A state's recipe, checked in every adapter's words."""
    if recipe not in ("current", "delayed"):
        raise invalid_argument("recipe", recipe, '"current" or "delayed"')


def require_history(history):
    """A state's amax history length, checked in every adapter's words."""
    if int(history) < 1:
        raise invalid_argument("history", history, "at least 1")


def moved_after_backward(recipe):
    """The histories a backward's step moves: the kernel-written ones, and dO's under delayed scaling
    (under current scaling dO's scale is this call's)."""
    return KERNEL_WRITTEN + (("d_o",) if recipe == "delayed" else ())
