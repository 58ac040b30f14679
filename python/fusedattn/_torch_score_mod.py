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


def call_tensors(entry, device):
    """The call's score_mod tensors, as fusedattn.torch's extras carry them: the scalars (float32
    [n], made once per device) and each captured tensor as float32, contiguous, on `device`."""
    if entry is None:
        return {}
    out = {}
    if entry.traced.scalars:
        scalars = entry.scalars.get(device)
        if scalars is None:
            scalars = torch.tensor(entry.traced.scalars, dtype=torch.float32, device=device)
            entry.scalars[device] = scalars
        out["mod_scalars"] = scalars
    for slot, tensor in enumerate(entry.traced.tensors):
        if tensor.requires_grad:
            raise NotSupportedError(f"score_mod: tensor t{slot} ({entry.traced.axes[slot]}) requires grad: gradients "
                                    "of tensors inside a score modifier are not built yet (detach it, or pass it "
                                    "as bias=)")
        out[f"mod_t{slot}"] = tensor.detach().to(device=device, dtype=torch.float32).contiguous()
    return out


def check_tensors(spec, extras, axes):
    """Each captured tensor spans exactly its axes' sizes in this call ([b, h_q, s_q, s_kv])."""
    sizes = {"b": spec.batch, "h": spec.heads_q, "q": spec.seq_q, "kv": spec.seq_kv}
    for slot, names in enumerate(axes):
        tensor = getattr(extras, f"mod_t{slot}")
        want = tuple(sizes[name] for name in names.split(","))
        if tuple(tensor.shape) != want:
            raise invalid_argument(f"score_mod.t{slot}.shape", tuple(tensor.shape),
                                   f"{want}, the sizes of [{names}] in this call")
