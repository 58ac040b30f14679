"""An FP8 attention layer's scaling state: Fp8State, whose one float32 device buffer holds every
scale, descale, amax and amax history (so a step captured in a CUDA graph replays with the values
of each step), and Scaling, that buffer as the FP8 operator bodies use it: its slots' device
addresses and the recipes' steps (fusedattn/_fp8_recipe.py), enqueued on the current stream."""
import torch

from .. import _core as core
from .. import _fp8_recipe as _recipe
from ..errors import invalid_argument
from ._tensors import view

DTYPES = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}
# Each format's (forward dtype, gradients' dtype), by the name the operators carry (_fp8_recipe.py).
FORMATS = {name: (_BY_NAME[a], _BY_NAME[b]) for name, (a, b) in _recipe.FORMATS.items()}


def _buffer_size(history):
    """[n, 3] scale, descale, amax; then [n, history] amax histories."""
    return len(_recipe.TENSORS) * (3 + history)


def _split(buffer):
    """The buffer's scalars [n, 3] and histories [n, history] (the history length is its size's)."""
    n = len(_recipe.TENSORS)
    return buffer[:n * 3].view(n, 3), buffer[n * 3:].view(n, buffer.numel() // n - 3)


class Fp8State:
    """The scaling state of one attention layer: scales, descales, amaxes and (delayed scaling)
    amax histories, in one float32 device buffer. recipe: "current" or "delayed"; history: the
    delayed recipe's amax history length; margin: scales are divided by 2^margin; dtype:
    torch.float8_e4m3fn or torch.float8_e5m2; grad_dtype: the FP8 backward's dO and gradients,
    dtype's by default, or torch.float8_e5m2 beside E4M3 (the hybrid recipe); device: a CUDA device
    (default the current one), or "meta" for tracing without a GPU."""

    def __init__(self, recipe="delayed", *, history=16, margin=0, dtype=torch.float8_e4m3fn, grad_dtype=None,
                 device=None):
        _recipe.require_recipe(recipe)
        if dtype not in DTYPES:
            raise invalid_argument("dtype", dtype, "torch.float8_e4m3fn or torch.float8_e5m2")
        grad_dtype = dtype if grad_dtype is None else grad_dtype
        self.name = _recipe.format_name(DTYPES[dtype], DTYPES.get(grad_dtype))
        if self.name is None:
            raise invalid_argument("grad_dtype", grad_dtype,
                                   "torch.float8_e5m2 beside torch.float8_e4m3fn (the hybrid recipe), or dtype")
        _recipe.require_history(history)
        self.recipe, self.history, self.margin, self.dtype = recipe, int(history), int(margin), dtype
        self.grad_dtype = grad_dtype
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self.buffer = torch.zeros(_buffer_size(self.history), dtype=torch.float32, device=device)
        self.scalars, self.histories = _split(self.buffer)
        self.scalars[:, :2] = 1.0  # scales start at 1
        largest = core.fp8_max(DTYPES[dtype])
        self.scalars[_recipe.SLOT["s"], 0], self.scalars[_recipe.SLOT["s"], 1] = largest, 1.0 / largest
        self.calibrated = False  # the kernel-written tensors' scales have been measured once


class Scaling:
    """A state's buffer as the operator bodies see it: its slots' device addresses and the recipes'
    steps, enqueued on the current stream. CUDA only (it takes addresses). The operators carry a
    state as its buffer and its options: recipe, margin and the format's name (FORMATS)."""

    def __init__(self, buffer, *, recipe, margin, name):
        self.scalars, self.histories = _split(buffer)
        self.recipe, self.margin, self.name = recipe, margin, name
        self.dtype, self.grad_dtype = FORMATS[name]
        self.history = self.histories.shape[1]
        self.device = buffer.device

    def _at(self, name, part):
        return self.scalars[_recipe.SLOT[name], part].data_ptr()

    def scale(self, name):
        return self._at(name, 0)

    def descale(self, name):
        return self._at(name, 1)

    def amax(self, name):
        return self._at(name, 2)

    def slot_addresses(self, pass_, **given):
        """Every FP8 slot of the pass's tensor set (the core's table, core.fp8_scale_slots) as a device
        address: those `given` as given (the inputs' descales), the others from this state, a slot
        named descale_x, scale_x or amax_x taking x's descale, scale or amax."""
        of_state = {"descale": self.descale, "scale": self.scale, "amax": self.amax}
        out = {}
        for slot, _ in core.fp8_scale_slots(pass_):
            kind, tensor = slot.split("_", 1)
            out[slot] = given[slot] if slot in given else of_state[kind](tensor)
        return out

    def stream(self):
        return torch._C._cuda_getCurrentRawStream(self.device.index)

    def _dtype_name(self, name):
        return _recipe.dtype_name(name, self.name)

    def quantize(self, name, x):
        """x (model precision) in FP8, by the recipe; its scale and descale in the state."""
        dtype = _BY_NAME[self._dtype_name(name)]
        out = torch.empty_strided(x.size(), x.stride(), dtype=dtype, device=x.device)
        stream = self.stream()
        if self.recipe == "current":
            core.measure_amax(view(x), x.data_ptr(), self.amax(name), stream)
            self.set_from_amax(name)
            core.quantize_fp8(view(x), x.data_ptr(), view(out), out.data_ptr(), self.scale(name), 0, stream)
        else:
            core.quantize_fp8(view(x), x.data_ptr(), view(out), out.data_ptr(), self.scale(name), self.amax(name),
                              stream)
        return out

    def set_from_amax(self, name, source=None):
        """Current scaling of `name` from the amax of `source` (default: its own)."""
        core.scale_from_amax(self.amax(source or name), self._dtype_name(name), self.margin, self.scale(name),
                             self.descale(name), self.stream())

    def advance(self, names):
        """Delayed scaling's step for `names`: each history takes its amax, and the scale follows."""
        stream = self.stream()
        for name in names:
            history = self.histories[_recipe.SLOT[name]].data_ptr()
            core.update_delayed_scaling(history, history, self.history, self.amax(name), self._dtype_name(name),
                                        _recipe.margin_of(name, self.margin),
                                        self.scale(name), self.descale(name), stream)

    def used_descales(self):
        """This call's descales of Q, K, V and O, copied: the state's own move on with the next
        forward (or, under delayed scaling, right after this one), but the backward must undo the
        scales its saved FP8 tensors were made with. Views and one cat, no index list: a list
        would be copied from the host, which a CUDA graph capture refuses."""
        return torch.cat([self.scalars[_recipe.SLOT[n], 1:2] for n in ("q", "k", "v", "o")])


def dequantized(x8, descale, dtype):
    """x8 (FP8) times `descale` (a device address) in `dtype`, with x8's strides."""
    out = torch.empty_strided(x8.size(), x8.stride(), dtype=dtype, device=x8.device)
    core.dequantize_fp8(view(x8), x8.data_ptr(), view(out), out.data_ptr(), descale,
                        torch._C._cuda_getCurrentRawStream(x8.device.index))
    return out
