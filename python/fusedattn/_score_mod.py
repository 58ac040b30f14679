"""Score modifiers from Python functions: FlexAttention's score_mod(score, b, h, q_idx, kv_idx)
traced once with symbolic values (Sym, _score_mod_sym.py) into the core's expression text
(fusedattn/score_mod.h, whose grammar only the core parses). Framework-free: the adapters say what a
tensor is (fusedattn.torch through __torch_function__, fusedattn.jax through its own hooks) and get
back a Traced modifier.

Numbers in the function become runtime scalars ($0, $1, ...; one per distinct value), so changing a
softcap's cap or a window's width keeps the plan; 0, 1, the infinities and whole exponents 2 .. 8
stay in the structure.
Captured tensors become tensor leaves, indexed by the plain indices b, h, q_idx, kv_idx in that
order (t0[h] for table[h]); any operation the core's expressions lack raises NotSupportedError
naming it.

Terms added to the score that gather from a tensor (a relative-position table indexed by a clamped
key-minus-query distance) or read a tensor that needs a gradient cannot run inside cuDNN's score
graph, which has no gather and gives no gradient of its operands. They come apart as the bias of
the call (Traced.bias): evaluated densely by the adapter with its framework's operations
(_score_mod_bias.py), so the framework's autodiff takes the bias's gradient, which cuDNN computes as
dBias, back into the tables. In that bias's text a gather is G<slot>(index, ...)."""
import math
import re

from ._bias_program import bias_program
from ._score_mod_bias import split_bias
from ._score_mod_sym import Sym, not_covered
from .errors import NotSupportedError

LEAVES = ("score", "b", "h", "q", "kv")  # the traced function's arguments, as the expression names them
_AXIS_ORDER = ("b", "h", "q", "kv")
_STRUCTURAL = (0.0, 1.0, math.inf, -math.inf)


class Traced:
    """A traced modifier: its expression text, its scalars' values and its captured tensors (each
    with the axes that index it, or "" for one only gathered from), in slot order; and `bias`, the
    Traced of the terms that run as the call's bias (None when there are none). A text of "" is no
    modifier (the function was the score plus its bias)."""
    __slots__ = ("text", "scalars", "tensors", "axes", "bias")

    def __init__(self, text, scalars, tensors, axes, bias=None):
        self.text, self.scalars, self.tensors, self.axes = text, tuple(scalars), tuple(tensors), tuple(axes)
        self.bias = bias


class Tracer:
    """One tracing of a function: the numbers it met (runtime scalars) and the tensors it captured, by
    slot; `sym_class` makes its symbolic values (a Sym subclass may add a framework's dispatch)."""
    stopped = frozenset()  # ids of tensors taken through stop_gradient (fusedattn.jax)

    def __init__(self, is_tensor, sym_class, is_learnable=lambda tensor: False):
        self.is_tensor, self.sym_class, self.is_learnable = is_tensor, sym_class, is_learnable
        self.scalars = []  # values, in slot order
        self.tensors = []  # (tensor, axes); axes "" for a tensor only gathered from

    def number(self, value):
        value = float(value)
        if math.isnan(value):
            raise not_covered("a NaN constant")
        if value in _STRUCTURAL:
            return "inf" if value == math.inf else "-inf" if value == -math.inf else ("1" if value == 1.0 else "0")
        for slot, seen in enumerate(self.scalars):
            if seen == value:
                return f"${slot}"
        self.scalars.append(value)
        return f"${len(self.scalars) - 1}"

    def operand(self, x):
        if isinstance(x, Sym):
            return x.text
        if isinstance(x, bool):
            return "1" if x else "0"
        if isinstance(x, (int, float)):
            return self.number(x)
        if self.is_tensor(x) and _numel(x) == 1 and getattr(x, "ndim", 1) == 0:
            raise not_covered("a 0-d tensor operand (pass a Python number, or index a tensor by b, h, q_idx, kv_idx)")
        raise not_covered(f"an operand of type {type(x).__name__}")

    def index(self, tensor, index):
        """tensor[index]: a tensor leaf for plain indices in b, h, q, kv order, one per dimension,
        and a gather G<slot>(...) for any other integer indices (or a tensor that needs a gradient:
        either runs as the call's bias, see the module's docstring)."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != len(tuple(tensor.shape)):
            raise not_covered(f"indexing a {len(tuple(tensor.shape))}-d tensor by {len(index)} indices "
                              "(one index per dimension)")
        names = [i.text if isinstance(i, Sym) else None for i in index]
        plain = (all(n in _AXIS_ORDER for n in names) and sorted(names, key=_AXIS_ORDER.index) == names
                 and len(set(names)) == len(names))
        if not plain or self.is_learnable(tensor):
            return self.sym_class(self, f"G{self._slot(tensor, '')}({','.join(self.operand(i) for i in index)})")
        axes = ",".join(names)
        return self.sym_class(self, f"t{self._slot(tensor, axes)}[{axes}]")

    def _slot(self, tensor, axes):
        """The slot of `tensor` indexed by `axes` ("" for gathers, which take any indices). One tensor
        read at two sets of indices takes a slot for each (a document mask's doc[q_idx] ==
        doc[kv_idx] reads one table along the queries and along the keys)."""
        for slot, (seen, seen_axes) in enumerate(self.tensors):
            if seen is tensor and seen_axes == axes:
                return slot
        self.tensors.append((tensor, axes))
        return len(self.tensors) - 1


def under_mask(modifier, mask):
    """The Traced of a score_mod's `modifier` (or None: the score itself) under a mask_mod's `mask`
    (traced as select(condition,score,-inf)): select(condition, modifier, -inf), the mask's slots
    numbered after the modifier's. The modifier's bias part stays its bias: added after the mask,
    it leaves a dropped key at -inf, so the two compose where tracing them as one function would put
    a gathered term inside the select, which no bias can take out."""
    condition = mask.text[len("select("):-len(",score,-inf)")]
    if modifier is None:
        return mask
    scalars, tensors = len(modifier.scalars), len(modifier.tensors)
    condition = re.sub(r"\$(\d+)", lambda m: f"${int(m.group(1)) + scalars}", condition)
    condition = re.sub(r"\b([tG])(\d+)([\[(])", lambda m: f"{m.group(1)}{int(m.group(2)) + tensors}{m.group(3)}",
                       condition)
    if modifier.bias is not None:  # beside a bias every number is written into the modifier (finish())
        condition = re.sub(r"\$(\d+)", lambda m: repr(float(mask.scalars[int(m.group(1)) - scalars])), condition)
        mask_scalars = ()
    else:
        mask_scalars = mask.scalars
    return Traced(f"select({condition},{modifier.text or 'score'},-inf)", modifier.scalars + mask_scalars,
                  modifier.tensors + mask.tensors, modifier.axes + mask.axes, bias=modifier.bias)


def _numel(x):
    n = 1
    for d in tuple(getattr(x, "shape", ())):
        n *= d
    return n


def trace(fn, is_tensor, sym_class=None, is_learnable=lambda tensor: False):
    """Traces fn(score, b, h, q_idx, kv_idx) into a Traced modifier; `is_tensor` says which Python
    objects are the framework's tensors (the ones fn may capture and index), `sym_class` (a
    subclass of Sym) may add the framework's dispatch hook, and `is_learnable` says which tensors
    need a gradient (their terms run as the bias)."""
    tracer = Tracer(is_tensor, sym_class or Sym, is_learnable)
    leaves = [tracer.sym_class(tracer, name) for name in LEAVES]
    try:
        out = fn(*leaves)
    except NotSupportedError:
        raise
    except TypeError as error:  # an operation with no rule, met by the framework
        raise not_covered(f"an operation in the function ({error})") from None
    return finish(tracer, out)


def finish(tracer, out):
    """The Traced modifier of `out`, the terms added to the score that gather or need a gradient
    split off as its bias (the module's docstring)."""
    text = out.text if isinstance(out, Sym) else tracer.operand(out)  # a function of nothing: a constant
    modifier, bias = split_bias(text)
    if bias is not None:
        # cuDNN 9.19 builds no backward of a modifier reading runtime scalars beside a bias and its
        # gradient ("!pointwise_node->bPort.tensor->getIsByValue()" for a softcap beside a learned
        # relative-position table on the H200): there the numbers are written into the modifier,
        # so each value gets its own plan. (The backward it then built gave a wrong dBias, so the
        # core's policy refuses a bias's gradient beside a modifier; a gathered table that needs
        # none keeps this form, which is known to build.)
        modifier = re.sub(r"\$(\d+)", lambda match: repr(float(tracer.scalars[int(match.group(1))])), modifier)
    traced = _numbered(tracer, modifier)
    if bias is not None:
        traced.bias = _numbered(tracer, bias)
        bias_program(traced.bias.text)  # made now, outside any compiled code that will evaluate it
    return traced


def _numbered(tracer, text):
    """The Traced of `text`, its slots renumbered in the order the text first uses them (a
    framework's own steps may have made numbers or tensors that the result does not use). The
    tracer's own slot tokens ($N, tN[...], GN(...)) are rewritten in place; nothing else is read."""
    scalars, tensors = [], []

    def scalar(match):
        value = tracer.scalars[int(match.group(1))]
        if value not in scalars:
            scalars.append(value)
        return f"${scalars.index(value)}"

    def tensor(match):  # a slot is a tensor at one set of axes (Tracer._slot)
        entry = tracer.tensors[int(match.group(2))]
        same = lambda other: other[0] is entry[0] and other[1] == entry[1]  # noqa: E731
        if not any(same(seen) for seen in tensors):
            tensors.append(entry)
        slot = next(i for i, seen in enumerate(tensors) if same(seen))
        return f"{match.group(1)}{slot}{match.group(3)}"

    text = re.sub(r"\$(\d+)", scalar, text)
    text = re.sub(r"\b([tG])(\d+)([\[(])", tensor, text)
    return Traced(text, scalars, [t for t, _ in tensors], [a for _, a in tensors])
