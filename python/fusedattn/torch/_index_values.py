"""A bias's index values kept between eager calls (fusedattn/_bias_program.py): the parts of a
gathered or learned term that depend on the indices and numbers alone (T5's bucket of kv - q) are
the same at every call of one size, so an eager call computes them once and later calls only
gather. Kept per bias structure, numbers, call size and device, bounded by bytes, the least
recently used going first."""
import collections

import torch

_BYTES = 256 << 20  # all values kept together; one call size's over a quarter of it is not kept
_kept = collections.OrderedDict()  # (text, scalars, sizes, device) -> {step: value}


def _key(part, sizes, device):
    return part.text, tuple(float(x) for x in part.scalars), tuple(int(n) for n in sizes), str(device)


def _size(values):
    return sum(v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor))


def kept(part, sizes, device):
    """The mapping of index values for a traced bias `part` over `sizes` on `device`, or None where
    values must not be kept: compiled code (its values are graph values), meta tensors (no data),
    and CUDA-graph capture (kernels captured, not run: the values would be unwritten memory)."""
    if torch.compiler.is_compiling() or device.type == "meta":
        return None
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    key = _key(part, sizes, device)
    entry = _kept.setdefault(key, {})
    _kept.move_to_end(key)
    return entry


def settle(part, sizes, device):
    """After a call that was given kept(...): drops its values if they are too large to keep, then
    the least recently used entries while all together are over the bound."""
    key = _key(part, sizes, device)
    if key in _kept and _size(_kept[key]) > _BYTES // 4:
        del _kept[key]
    total = sum(_size(values) for values in _kept.values())
    while total > _BYTES:
        _, oldest = _kept.popitem(last=False)
        total -= _size(oldest)


def clear():
    """Forgets every kept value (tests; memory back to the caching allocator)."""
    _kept.clear()
