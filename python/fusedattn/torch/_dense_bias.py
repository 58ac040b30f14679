"""fusedattn.torch's score_mod terms that run as the call's bias (fusedattn/_score_mod_bias.py: gathers
from a tensor, or terms reading one that requires grad): the traced bias part evaluated with torch
operations on index grids, once per distance kv - q where it reads positions only through it
(_distance_bias.py), so that autograd carries dBias into the tensors' gradients."""
import torch

from .. import _config, _score_mod_bias
from . import _distance_bias, _index_values


def dense_bias(part, q, k, layout):
    """The bias of a traced bias part: its expression at every (b, h, q_idx, kv_idx) of this call,
    in q's dtype, in the nearest bias shape the core takes (_score_mod_bias.bias_shape), differentiable
    in the tensors it reads."""
    sizes = _score_mod_bias.bias_sizes(layout, _config.AXES, q.shape, k.shape)
    by_distance = _distance_bias.applies(part.text, sizes)  # evaluated once per distance kv - q
    at = _distance_bias.grid_sizes(sizes) if by_distance else sizes
    grids = {name: torch.arange(n, device=q.device).view(*([1] * axis), n, *([1] * (3 - axis)))
             for axis, (name, n) in enumerate(zip(("b", "h", "q", "kv"), at))}
    if by_distance:
        grids["kv"] = _distance_bias.key_grid(sizes, q.device)
    kept = _index_values.kept(part, at, q.device)
    value = _score_mod_bias.evaluate_dense(part, grids, _operations(q.device, at, out_dtype=q.dtype), kept)
    if kept is not None:
        _index_values.settle(part, at, q.device)
    value = torch.as_tensor(value, device=q.device)
    value = value.reshape((1,) * (4 - value.dim()) + tuple(value.shape))
    if by_distance and value.shape[3] > 1:
        value = _distance_bias.toeplitz(value, sizes[2], sizes[3], q.dtype)
    return value.expand(*_score_mod_bias.bias_shape(value.shape, sizes)).contiguous().to(q.dtype)


def _operations(device, sizes, *, out_dtype=None):
    def tensor(x):
        return x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32, device=device)

    def leaf(t, axes):
        named = axes.split(",")
        shape = [n if name in named else 1 for name, n in zip(("b", "h", "q", "kv"), sizes)]
        return t.to(device=device, dtype=torch.float32).reshape(shape)

    def integer(x):
        return x.round().long() if isinstance(x, torch.Tensor) and x.is_floating_point() else (
            x if isinstance(x, torch.Tensor) else int(x))

    unary = {"neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
             "tanh": torch.tanh, "sigmoid": torch.sigmoid, "not": lambda x: torch.logical_not(tensor(x)),
             # on a condition too (a bool cast to an integer): as the 0 or 1 it stands for
             "floor": lambda x: torch.floor(tensor(x).float()), "ceil": lambda x: torch.ceil(tensor(x).float()),
             "trunc": lambda x: torch.trunc(tensor(x).float()), "sign": lambda x: torch.sign(tensor(x).float())}
    ops = {name: (lambda f: lambda x: f(tensor(x)))(f) for name, f in unary.items()}
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.true_divide, "pow": torch.pow,
              "min": torch.minimum, "max": torch.maximum, "and": torch.logical_and, "or": torch.logical_or,
              "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}
    ops.update({name: (lambda f: lambda x, y: f(tensor(x), tensor(y)))(f) for name, f in binary.items()})
    ops["select"] = lambda c, x, y: torch.where(tensor(c) != 0, tensor(x), tensor(y))
    ops.update(leaf=leaf, integer=integer, gather=lambda t, indices: t.to(device)[tuple(indices)])
    # A gather that is the whole bias reads a table already in the bias's dtype: the same values
    # (rounding commutes with picking), half the bytes written, no pass to convert. A table that
    # needs a gradient is gathered as it is, so that its gradient sums in its own precision.
    if out_dtype is not None:
        ops["root gather"] = lambda t, indices: (t.to(device) if t.requires_grad else
                                                 t.to(device=device, dtype=out_dtype))[tuple(indices)]
    return ops

