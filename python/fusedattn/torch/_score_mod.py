"""fusedattn.torch's score_mod: FlexAttention's score functions traced into the core's expressions
(fusedattn/_score_mod.py), and their runtime values (scalars, captured tensors) as tensors of the
call.

A function is traced once per function object and per value of the numbers its closure holds, so
a cap kept in a closure variable is seen when it changes; captured tensors are read at every call
(their values are runtime data, as the scalars are). Terms added to the score that gather from a
tensor or read one that requires grad become the call's bias (fusedattn/_score_mod_bias.py), evaluated
by _dense_bias.py, so autograd carries dBias into the tensors' gradients."""
import functools
import weakref

import torch

from .. import _mask_structure, _score_mod, _score_mod_sym
from ..errors import NotSupportedError, invalid_argument
from . import _flex_views
from ._dense_bias import dense_bias


class _TorchSym(_score_mod_sym.Sym):
    """A traced value that torch functions (torch.tanh, torch.where, tensor[h]) dispatch to."""
    __slots__ = ()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _score_mod_sym.apply(getattr(func, "__name__", str(func)), args, kwargs)


def _is_tensor(x):
    return isinstance(x, torch.Tensor)


class _Entry:
    """One traced function: the modifier, its scalars on each device they were needed on, and which
    of its tensors required grad when it was traced (a change retraces: it moves terms between the
    modifier and the bias), and, for a mask, its structure once asked (mask_structure)."""
    __slots__ = ("key", "traced", "scalars", "learnable", "structure")

    def __init__(self, key, traced):
        self.key, self.traced, self.scalars = key, traced, {}
        self.learnable = _learnable_now(self)
        self.structure = _UNASKED


_entries = weakref.WeakKeyDictionary()  # function -> its latest _Entry
_UNASKED = object()  # an _Entry's structure before mask_structure asked for it


class _Masked:
    """FlexAttention's mask_mod(b, h, q_idx, kv_idx) -> bool beside a score_mod (or none): the
    modified score where the mask keeps a key, -inf where it does not. One object per pair
    (masked()), so that it is traced once; its key is both functions' closure numbers."""

    def __init__(self, score_mod, mask_mod):
        self.score_mod, self.mask_mod = score_mod, mask_mod

    def __call__(self, score, b, h, q_idx, kv_idx):
        kept = score if self.score_mod is None else self.score_mod(score, b, h, q_idx, kv_idx)
        return torch.where(self.mask_mod(b, h, q_idx, kv_idx), kept, -float("inf"))


@torch.compiler.assume_constant_result  # compiled code gets the structure as a constant
def mask_structure(mask_mod):
    """("band", left) or ("prefix", length) where mask_mod is one of cuDNN's own masks
    (fusedattn/_mask_structure.py), else None. Kept with the mask's trace: flex_attention asks for it
    several times a call."""
    entry = traced(masked(None, mask_mod))
    if entry.structure is _UNASKED:
        found = _mask_structure.structure(entry.traced.text, entry.traced.scalars)
        entry.structure = (("band", found.left) if isinstance(found, _mask_structure.Band) else
                           None if found is None else ("prefix", found.length))
    return entry.structure


def learned(score_mod):
    """Whether score_mod (or None) has terms that need a gradient (a tensor it reads requires grad),
    which a piece of a mask's schedule does not carry back. Asked of its trace: eager calls only."""
    return score_mod is not None and any(traced(score_mod).learnable)


@torch.compiler.assume_constant_result
def reads_indices(score_mod):
    """Whether score_mod (or None) reads the batch, query or key index, which a call over a slice of
    the rows would renumber."""
    if score_mod is None:
        return False
    mod = traced(score_mod).traced
    return mod.bias is not None or _mask_structure.reads_indices(mod.text)


@functools.lru_cache(maxsize=256)
def masked(score_mod, mask_mod):
    """The score function of score_mod (or None) under mask_mod, the same object for the same pair."""
    return _Masked(score_mod, mask_mod)


def _closure_numbers(fn):
    if isinstance(fn, _flex_views.Shifted):
        return (_closure_numbers(fn.inner), fn.rows, fn.keys)
    if isinstance(fn, _Masked):
        return tuple(_closure_numbers(part) for part in (fn.score_mod, fn.mask_mod) if part is not None)
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
    if entry is not None and entry.key == key and entry.learnable == _learnable_now(entry):
        return entry
    if isinstance(fn, _Masked) and fn.score_mod is not None:  # traced apart, then composed
        modifier, mask = traced(fn.score_mod).traced, traced(masked(None, fn.mask_mod)).traced
        entry = _Entry(key, _score_mod.under_mask(modifier, mask))
    elif isinstance(fn, _flex_views.Shifted):  # over a view: the whole problem's trace, moved
        entry = _Entry(key, _flex_views.shift(traced(fn.inner).traced, fn.rows, fn.keys))
    else:
        entry = _Entry(key, _score_mod.trace(fn, _is_tensor, _TorchSym, lambda t: t.requires_grad))
    try:
        _entries[fn] = entry
    except TypeError:
        pass
    return entry


def _parts(traced):
    """The traced modifier, and its bias part where it has one."""
    return (traced,) + ((traced.bias,) if traced.bias is not None else ())


def _learnable_now(entry):
    return tuple(t.requires_grad for part in _parts(entry.traced) for t in part.tensors)


def _place(fn, tensor):
    """Where `fn` holds a tensor it captured: a closure cell, a global, or an attribute of the object
    a bound method belongs to, so that compiled code fetches it as a graph input. A masked function
    (_Masked) holds it in one of its two functions: the place says which."""
    if isinstance(fn, _Masked):
        for which, part in (("score_mod", fn.score_mod), ("mask_mod", fn.mask_mod)):
            if part is None:
                continue
            try:
                return (which,) + _place(part, tensor)
            except NotSupportedError:
                continue
        raise NotSupportedError("score_mod under torch.compile: a captured tensor that neither the score_mod nor "
                                "the mask_mod holds in its closure, its globals or its object's attributes")
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
def _constant_trace(score_mod, mask_mod):
    fn = score_mod if mask_mod is None else masked(score_mod, mask_mod)
    entry = traced(fn)
    return tuple((part.text, part.scalars, tuple(_place(fn, t) for t in part.tensors)) for part in _parts(entry.traced))


def _fetch(score_mod, mask_mod, place):
    if place[0] in ("score_mod", "mask_mod"):  # a place in one function of a masked pair
        return _fetch(score_mod if place[0] == "score_mod" else mask_mod, None, place[1:])
    fn = score_mod
    kind, key = place
    if kind == "closure":
        return fn.__closure__[key].cell_contents
    if kind == "global":
        return fn.__globals__[key]
    return getattr(fn.__self__, key)


def _converted(tensor, device):
    return tensor.to(device=device, dtype=torch.float32).contiguous()  # never one that requires grad (the bias's)


class _Part:
    """A traced part as compiled code rebuilds it: text, scalars, and the tensors fetched anew."""
    __slots__ = ("text", "scalars", "tensors")

    def __init__(self, text, scalars, tensors):
        self.text, self.scalars, self.tensors = text, scalars, tensors


def prepare(score_mod, q, k, layout, *, mask_mod=None):
    """(expression text, the call's score_mod tensors as Extras carries them (_tensors.py), the
    bias of its gathered or learned terms or None) of score_mod (or None) under mask_mod (or None):
    the scalars (float32 [n], made once per device in eager calls) and each captured tensor as
    float32, contiguous, on q's device. In compiled code the trace comes in as constants and the
    tensors as graph inputs (the two functions are constants there; a pair made of them is not)."""
    device = q.device
    if torch.compiler.is_compiling():
        parts = [_Part(text, scalars, [_fetch(score_mod, mask_mod, place) for place in places])
                 for text, scalars, places in _constant_trace(score_mod, mask_mod)]
        text, scalars, tensors = parts[0].text, parts[0].scalars, parts[0].tensors
        bias_part = parts[1] if len(parts) > 1 else None
        # One op per value (torch.tensor of constants would be a tensor outside the graph).
        out = {"mod_scalars": torch.stack([torch.full((), x, dtype=torch.float32, device=device) for x in scalars])} \
            if scalars else {}
    else:
        entry = traced(score_mod if mask_mod is None else masked(score_mod, mask_mod))
        text, tensors, out, bias_part = entry.traced.text, entry.traced.tensors, {}, entry.traced.bias
        if entry.traced.scalars:
            out["mod_scalars"] = _device_scalars(entry, device)
    for slot, tensor in enumerate(tensors):
        out[f"mod_t{slot}"] = _converted(tensor, device)
    return text, out, (None if bias_part is None else dense_bias(bias_part, q, k, layout))


def scalars_only(score_mod, device):
    """(expression text, its scalars on `device` or None) of a score_mod whose only runtime values
    are its scalars (a softcap: no tensor it reads, no bias part), which fusedattn.torch's C++ path
    takes; ("", None) for no score_mod; None for any other. Eager calls only."""
    if score_mod is None:
        return "", None
    entry = traced(score_mod)
    if entry.traced.tensors or entry.traced.bias is not None:
        return None
    return entry.traced.text, (_device_scalars(entry, device) if entry.traced.scalars else None)


def _device_scalars(entry, device):
    """The entry's scalars as float32 [n] on `device`, made once per device."""
    scalars = entry.scalars.get(device)
    if scalars is None:
        scalars = entry.scalars[device] = torch.tensor(entry.traced.scalars, dtype=torch.float32, device=device)
    return scalars
