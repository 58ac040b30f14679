"""An FP8 attention layer's scaling state: Fp8State, whose one float32 device buffer holds every
scale, descale, amax and amax history (so a step captured in a CUDA graph replays with the values
of each step), and Scaling, that buffer with its options (_fp8_recipe.Options) as the FP8 operator
bodies use it: its slots' device addresses, and the recipes' quantizations and scale updates, each
a few launches on the current stream."""
import torch

from .. import _core as core
from .. import _fp8_recipe as _recipe
from ..errors import invalid_argument
from ._tensors import view

DTYPES = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}
# Each format's (forward dtype, gradients' dtype), by the name the options carry (_fp8_recipe.py).
FORMATS = {name: (_BY_NAME[a], _BY_NAME[b]) for name, (a, b) in _recipe.FORMATS.items()}
_N = len(_recipe.TENSORS)


def _split(buffer):
    """The buffer's scalars [n, 3] (scale, descale, amax: a view of its field-major [3, n] start, so
    that the amaxes of Q, K and V lie side by side and one memset zeroes them) and histories
    [n, history] (the history length is its size's)."""
    return buffer[:3 * _N].view(3, _N).t(), buffer[3 * _N:].view(_N, buffer.numel() // _N - 3)


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
        name = _recipe.format_name(DTYPES[dtype], DTYPES.get(grad_dtype))
        if name is None:
            raise invalid_argument("grad_dtype", grad_dtype,
                                   "torch.float8_e5m2 beside torch.float8_e4m3fn (the hybrid recipe), or dtype")
        _recipe.require_history(history)
        self.options = _recipe.Options(recipe, int(margin), name)
        self.history, self.dtype, self.grad_dtype = int(history), dtype, grad_dtype
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self.buffer = torch.zeros(_N * (3 + self.history), dtype=torch.float32, device=device)
        self.scalars, self.histories = _split(self.buffer)
        self.scalars[:, :2] = 1.0  # scales start at 1
        largest = core.fp8_max(DTYPES[dtype])
        self.scalars[_recipe.SLOT["s"], 0], self.scalars[_recipe.SLOT["s"], 1] = largest, 1.0 / largest
        self.calibrated = False  # the kernel-written tensors' scales have been measured once

    @property
    def recipe(self):
        return self.options.recipe

    @property
    def margin(self):
        return self.options.margin

    @property
    def name(self):
        """The format's name: "e4m3", "e5m2" or "hybrid"."""
        return self.options.format


class Scaling:
    """A state's buffer and options as the operator bodies see it: its slots' device addresses, and
    the recipe's quantizations and scale updates, enqueued on the current stream. CUDA only (it
    takes addresses)."""

    def __init__(self, buffer, options):
        self.scalars, self.histories = _split(buffer)
        self.options = options
        self.dtype, self.grad_dtype = FORMATS[options.format]
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
        return _recipe.dtype_name(name, self.options.format)

    def update(self, updates, used=None):
        """A step's `updates` (_fp8_recipe.Update) in one launch; `used`: the float32 [4] tensor
        that updates with a `used` slot report into."""
        history = self.histories.shape[1]
        rows = []
        for u in updates:
            delayed = u.rule == "delayed"
            rows.append((u.rule, 0 if u.rule == "keep" else self.amax(u.amax_of),
                         self.histories[_recipe.SLOT[u.tensor]].data_ptr() if delayed else 0, history if delayed else 0,
                         self._dtype_name(u.tensor), _recipe.margin_of(u.tensor, self.options.margin),
                         self.scale(u.tensor), self.descale(u.tensor),
                         0 if u.used is None else used[u.used].data_ptr()))
        core.update_fp8_scales(rows, self.stream())

    def _quantized(self, names, xs, *, record_amax):
        """xs in FP8 with their slots' scales (and, record_amax, their amaxes), in one call."""
        outs = [torch.empty_strided(x.size(), x.stride(), dtype=_BY_NAME[self._dtype_name(n)], device=x.device)
                for n, x in zip(names, xs)]
        jobs = [(view(x), x.data_ptr(), view(o), o.data_ptr(), self.scale(n), self.amax(n) if record_amax else 0)
                for n, x, o in zip(names, xs, outs)]
        core.quantize_fp8_many(jobs, self.stream())
        return outs

    def _measure(self, names, xs):
        core.measure_amax_many([(view(x), x.data_ptr(), self.amax(n)) for n, x in zip(names, xs)], self.stream())

    def quantize_inputs(self, q, k, v):
        """Q, K and V in FP8 by the recipe, O's scale set from V's amax, and the descales of Q, K, V
        and O this forward uses ([4], _recipe.USED), which its backward undoes: the state's own move
        on with the next forward (or, delayed, right now)."""
        used = torch.empty(4, dtype=torch.float32, device=q.device)
        current = self.options.recipe == "current"
        if current:
            self._measure("qkv", (q, k, v))
            self.update(_recipe.forward_updates("current"), used)
        out = self._quantized("qkv", (q, k, v), record_amax=not current)
        if not current:
            self.update(_recipe.forward_updates("delayed"), used)
        return out[0], out[1], out[2], used

    def quantize_gradient(self, d_o):
        """dO in the gradients' FP8 by the recipe (its amax measured first under current scaling,
        recorded while quantizing under delayed)."""
        current = self.options.recipe == "current"
        if current:
            self._measure(("d_o",), (d_o,))
            self.update(_recipe.gradient_updates("current"))
        return self._quantized(("d_o",), (d_o,), record_amax=not current)[0]


def dequantized_many(pairs, dtype):
    """Each (x8, descale address) of `pairs` as x8 times the descale in `dtype`, with x8's strides, in
    one call."""
    outs = [torch.empty_strided(x8.size(), x8.stride(), dtype=dtype, device=x8.device) for x8, _ in pairs]
    if outs:
        core.dequantize_fp8_many([(view(x8), x8.data_ptr(), view(o), o.data_ptr(), descale)
                                  for (x8, descale), o in zip(pairs, outs)],
                                 torch._C._cuda_getCurrentRawStream(outs[0].device.index))
    return outs


def dequantized(x8, descale, dtype):
    """x8 (FP8) times `descale` (a device address) in `dtype`, with x8's strides."""
    return dequantized_many([(x8, descale)], dtype)[0]
