"""The FP8 scaling recipes' framework-free parts, shared by fusedattn.torch and fusedattn.jax: the
tensors a state scales (in slot order), which of them the kernels write, their headroom, the
recipe's checks, a state's options as one object (Options), and each step's scale updates in order
(the programs below). Each adapter keeps only its arrays and runs the programs: fusedattn.torch in
one launch each (fusedattn/fp8.h's update_fp8_scales), fusedattn.jax as array operations.
"""
import dataclasses

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


@dataclasses.dataclass(frozen=True)
class Options:
    """A state's options, fixed when it is made: its recipe ("current" or "delayed"), margin (scales
    divided by 2^margin) and format (FORMATS' name). Operators of compiled code carry it as `text`,
    one string beside the state's buffer (their schemas take tensors and plain values only)."""
    recipe: str
    margin: int
    format: str

    @property
    def text(self):
        return f"{self.recipe} {self.margin} {self.format}"

    @staticmethod
    def parse(text):
        recipe, margin, format = text.split(" ")
        return Options(recipe, int(margin), format)


@dataclasses.dataclass(frozen=True)
class Update:
    """One scale update of a step (fusedattn/fp8.h's Fp8ScaleUpdate): `rule` "from_amax" (current
    scaling from the amax of `source`), "delayed" (`tensor`'s history takes its amax) or "keep";
    `used`, where not None, is the slot of the step's used descales (Q, K, V, O) that gets
    `tensor`'s descale as it was before the update."""
    rule: str
    tensor: str
    source: str = None
    used: int = None

    @property
    def amax_of(self):
        return self.source or self.tensor


USED = ("q", "k", "v", "o")  # a forward's used descales, the ones its backward undoes


def forward_updates(recipe):
    """A forward's updates, after its inputs' amaxes are measured (current: before quantizing with
    the scales these set) or recorded (delayed: while quantizing with the scales of the last step):
    O's scale from V's amax (|O| <= max |V|), then the inputs' steps, each reporting the descale
    its quantization used, and O's."""
    if recipe == "current":
        return (tuple(Update("from_amax", n) for n in "qkv") + (Update("from_amax", "o", source="v"),)
                + tuple(Update("keep", n, used=i) for i, n in enumerate(USED)))
    return ((Update("from_amax", "o", source="v"),) + tuple(Update("delayed", n, used=i) for i, n in enumerate("qkv"))
            + (Update("keep", "o", used=3),))


def gradient_updates(recipe):
    """dO's update before it is quantized: current scaling from its measured amax; none under
    delayed scaling, whose step comes after the backward."""
    return (Update("from_amax", "d_o"),) if recipe == "current" else ()


def delayed_updates(names):
    """Delayed scaling's steps of `names`: a first backward's calibration (KERNEL_WRITTEN), and the
    step after a backward (moved_after_backward)."""
    return tuple(Update("delayed", n) for n in names)
