"""fusedattn.torch's score_mod: FlexAttention's score functions traced into the core's expressions
(_score_mod.py), and their runtime values (scalars, captured tensors) as tensors of the call.

A function is traced once per function object and per value of the numbers its closure holds, so
a cap kept in a closure variable is seen when it changes; captured tensors are read at every call
(their values are runtime data, as the scalars are)."""
import weakref

import torch

from . import _score_mod
from .errors import NotSupportedError, invalid_argument


class _TorchSym(_score_mod.Sym):
    """A traced value that torch functions (torch.tanh, torch.where, tensor[h]) dispatch to."""
    __slots__ = ()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _score_mod.apply(getattr(func, "__name__", str(func)), args, kwargs)


def _is_tensor(x):
    return isinstance(x, torch.Tensor)


class _Entry:
    """One traced function: the modifier, and its scalars on each device they were needed on."""
    __slots__ = ("key", "traced", "scalars")

    def __init__(self, key, traced):
        self.key, self.traced, self.scalars = key, traced, {}


_entries = weakref.WeakKeyDictionary()  # function -> its latest _Entry


def _closure_numbers(fn):
    cells = getattr(fn, "__closure__", None) or ()
    values = []
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, (bool, int, float)):
            values.append(value)
    return tuple(values)


def traced(fn):
    """The _Entry of score_mod function `fn` (traced on first use, again when its closure's numbers
    change). Raises NotSupportedError naming an operation the core's expressions lack."""
    if not callable(fn):
        raise invalid_argument("score_mod", type(fn).__name__, "a function (score, b, h, q_idx, kv_idx) -> score")
    key = _closure_numbers(fn)
    try:
        entry = _entries.get(fn)
    except TypeError:  # not weak-referenceable (a builtin): trace every call
        entry = None
    if entry is not None and entry.key == key:
        return entry
    entry = _Entry(key, _score_mod.trace(fn, _is_tensor, _TorchSym))
    try:
        _entries[fn] = entry
    except TypeError:
        pass
    return entry


def _place(fn, tensor):
    """Where `fn` holds a tensor it captured: a closure cell, a global, or an attribute of the object
    a bound method belongs to, so that compiled code fetches it as a graph input."""
    for index, cell in enumerate(getattr(fn, "__closure__", None) or ()):
        try:
            if cell.cell_contents is tensor:
                return ("closure", index)
        except ValueError:
            continue
    code = getattr(fn, "__code__", None)
    for name in code.co_names if code is not None else ():
        if getattr(fn, "__globals__", {}).get(name) is tensor:
            return ("global", name)
        owner = getattr(fn, "__self__", None)
        if owner is not None and getattr(owner, name, None) is tensor:
            return ("attribute", name)
    raise NotSupportedError("score_mod under torch.compile: a captured tensor that the function holds neither in "
                            "its closure, its globals nor its object's attributes")


@torch.compiler.assume_constant_result  # compiled code gets the trace as constants
def _constant_trace(fn):
    entry = traced(fn)
    return entry.traced.text, entry.traced.scalars, tuple(_place(fn, t) for t in entry.traced.tensors)


def _fetch(fn, place):
    kind, key = place
    if kind == "closure":
        return fn.__closure__[key].cell_contents
    if kind == "global":
        return fn.__globals__[key]
    return getattr(fn.__self__, key)


def _converted(slot, tensor, device):
    if tensor.requires_grad:
        raise NotSupportedError(f"score_mod: captured tensor t{slot} requires grad: gradients of tensors inside a "
                                "score modifier are not built yet (detach it, or pass it as bias=)")
    return tensor.to(device=device, dtype=torch.float32).contiguous()


def prepare(fn, device):
    """(expression text, the call's score_mod tensors as fusedattn.torch's extras carry them): the
    scalars (float32 [n], made once per device in eager calls) and each captured tensor as float32,
    contiguous, on `device`. In compiled code the trace comes in as constants and the tensors as
    graph inputs."""
    if torch.compiler.is_compiling():
        text, scalars, places = _constant_trace(fn)
        tensors = [_fetch(fn, place) for place in places]
        # One op per value (torch.tensor of constants would be a tensor outside the graph).
        out = {"mod_scalars": torch.stack([torch.full((), x, dtype=torch.float32, device=device) for x in scalars])} \
            if scalars else {}
    else:
        entry = traced(fn)
        text, tensors, out = entry.traced.text, entry.traced.tensors, {}
        if entry.traced.scalars:
            scalars = entry.scalars.get(device)
            if scalars is None:
                scalars = torch.tensor(entry.traced.scalars, dtype=torch.float32, device=device)
                entry.scalars[device] = scalars
            out["mod_scalars"] = scalars
    for slot, tensor in enumerate(tensors):
        out[f"mod_t{slot}"] = _converted(slot, tensor, device)
    return text, out


def check_tensors(spec, extras):
    """Each captured tensor has the shape its axes span in this call (the core says which)."""
    for slot in range(4):
        tensor = getattr(extras, f"mod_t{slot}")
        if tensor is None:
            break
        want = tuple(spec.score_mod_tensor_shape(slot))
        if tuple(tensor.shape) != want:
            raise invalid_argument(f"score_mod.t{slot}.shape", tuple(tensor.shape),
                                   f"shape {want}, the sizes its indices span in this call")
