"""Score modifiers from Python functions: FlexAttention's score_mod(score, b, h, q_idx, kv_idx)
traced once with symbolic values into the core's expression text (fusedattn/score_mod.h).
Framework-free: the adapters say what a tensor is (fusedattn.torch through __torch_function__,
fusedattn.jax through its own hooks) and get back a Traced modifier.

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
(evaluate_dense), so the framework's autodiff takes the bias's gradient, which cuDNN computes as
dBias, back into the tables. In that bias's text a gather is G<slot>(index, ...)."""
import math
import re

from .errors import NotSupportedError

_LEAVES = ("score", "b", "h", "q", "kv")
_AXIS_ORDER = ("b", "h", "q", "kv")
_STRUCTURAL = (0.0, 1.0, math.inf, -math.inf)


def not_covered(what):
    return NotSupportedError(f"score_mod: {what} is not covered by fusedattn's score modifiers "
                             "(the operations of fusedattn/score_mod.h: arithmetic, tanh, exp, log, sqrt, "
                             "sigmoid, abs, min, max, comparisons, logic and where)")


class Traced:
    """A traced modifier: its expression text, its scalars' values and its captured tensors (each
    with the axes that index it, or "" for one only gathered from), in slot order; and `bias`, the
    Traced of the terms that run as the call's bias (None when there are none). A text of "" is no
    modifier (the function was the score plus its bias)."""
    __slots__ = ("text", "scalars", "tensors", "axes", "bias")

    def __init__(self, text, scalars, tensors, axes, bias=None):
        self.text, self.scalars, self.tensors, self.axes = text, tuple(scalars), tuple(tensors), tuple(axes)
        self.bias = bias


class _Tracer:
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
        """The slot of `tensor`, indexed by `axes` ("" for gathers, which take any indices)."""
        for slot, (seen, seen_axes) in enumerate(self.tensors):
            if seen is tensor:
                if seen_axes != axes:
                    raise not_covered("one tensor indexed by two sets of indices (or gathered and indexed)")
                return slot
        self.tensors.append((tensor, axes))
        return len(self.tensors) - 1


def _numel(x):
    n = 1
    for d in tuple(getattr(x, "shape", ())):
        n *= d
    return n


def _call(tracer, op, *args):
    if op == "pow" and _small_whole(args[1]):
        # A whole power 2 .. 8 stays in the structure: the graph layer makes it a product, which takes
        # negative bases (cuDNN's own power does not).
        return tracer.sym_class(tracer, f"pow({tracer.operand(args[0])},{int(args[1])})")
    return tracer.sym_class(tracer, f"{op}({','.join(tracer.operand(a) for a in args)})")


def _small_whole(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and float(x).is_integer() and 2 <= x <= 8


class Sym:
    """A symbolic value of the traced function: operators build the expression."""
    __slots__ = ("tracer", "text")

    def __init__(self, tracer, text):
        self.tracer, self.text = tracer, text

    def _op(self, op, *others):
        return _call(self.tracer, op, self, *others)

    def _rop(self, op, other):
        return _call(self.tracer, op, other, self)

    __add__ = lambda self, o: self._op("add", o)
    __radd__ = lambda self, o: self._rop("add", o)
    __sub__ = lambda self, o: self._op("sub", o)
    __rsub__ = lambda self, o: self._rop("sub", o)
    __mul__ = lambda self, o: self._op("mul", o)
    __rmul__ = lambda self, o: self._rop("mul", o)
    __truediv__ = lambda self, o: self._op("div", o)
    __rtruediv__ = lambda self, o: self._rop("div", o)
    __pow__ = lambda self, o: self._op("pow", o)
    __rpow__ = lambda self, o: self._rop("pow", o)
    __neg__ = lambda self: self._op("neg")
    __pos__ = lambda self: self
    __abs__ = lambda self: self._op("abs")
    __lt__ = lambda self, o: self._op("lt", o)
    __le__ = lambda self, o: self._op("le", o)
    __gt__ = lambda self, o: self._op("gt", o)
    __ge__ = lambda self, o: self._op("ge", o)
    __eq__ = lambda self, o: self._op("eq", o)
    __ne__ = lambda self, o: self._op("ne", o)
    __and__ = lambda self, o: self._op("and", o)
    __rand__ = lambda self, o: self._rop("and", o)
    __or__ = lambda self, o: self._op("or", o)
    __ror__ = lambda self, o: self._rop("or", o)
    __invert__ = lambda self: self._op("not")
    __hash__ = None

    def __bool__(self):
        raise not_covered("Python control flow on a traced value (if, and, or, not: use torch.where, &, |, ~)")

    def __floordiv__(self, other):
        raise not_covered("floor division")

    __rfloordiv__ = __mod__ = __rmod__ = __floordiv__

    def __getattr__(self, name):
        # Tensor methods (score.tanh(), score.clamp(max=...)) as the functions of the same name.
        if name in _FUNCTIONS:
            return lambda *args, **kwargs: apply(name, (self,) + args, kwargs)
        if name in ("float", "to", "type_as", "contiguous", "clone", "detach"):
            return lambda *args, **kwargs: self
        raise not_covered(f"the method .{name}()")


def _clamp(tracer, x, lo=None, hi=None):
    out = x
    if lo is not None:
        out = _call(tracer, "max", out, lo)
    if hi is not None:
        out = _call(tracer, "min", out, hi)
    return out


def _where(tracer, cond, a, b):
    return _call(tracer, "select", cond, a, b)


def _unary(op):
    return lambda tracer, x: _call(tracer, op, x)


def _binary(op):
    return lambda tracer, x, y: _call(tracer, op, x, y)


# Functions by name (torch.tanh, Tensor.tanh and their jax.numpy namesakes) and what they become.
_FUNCTIONS = {
    "tanh": _unary("tanh"), "exp": _unary("exp"), "log": _unary("log"), "sqrt": _unary("sqrt"),
    "sigmoid": _unary("sigmoid"), "abs": _unary("abs"), "absolute": _unary("abs"), "neg": _unary("neg"),
    "negative": _unary("neg"), "logical_not": _unary("not"), "bitwise_not": _unary("not"),
    "rsqrt": lambda tracer, x: _call(tracer, "div", 1.0, _call(tracer, "sqrt", x)),
    "square": lambda tracer, x: _call(tracer, "mul", x, x),
    "add": _binary("add"), "sub": _binary("sub"), "subtract": _binary("sub"), "mul": _binary("mul"),
    "multiply": _binary("mul"), "div": _binary("div"), "divide": _binary("div"), "true_divide": _binary("div"),
    "pow": _binary("pow"), "power": _binary("pow"), "minimum": _binary("min"), "maximum": _binary("max"),
    "fmin": _binary("min"), "fmax": _binary("max"), "logical_and": _binary("and"), "logical_or": _binary("or"),
    "bitwise_and": _binary("and"), "bitwise_or": _binary("or"),
    "lt": _binary("lt"), "less": _binary("lt"), "le": _binary("le"), "less_equal": _binary("le"),
    "gt": _binary("gt"), "greater": _binary("gt"), "ge": _binary("ge"), "greater_equal": _binary("ge"),
    "eq": _binary("eq"), "equal": _binary("eq"), "ne": _binary("ne"), "not_equal": _binary("ne"),
    "where": _where, "clamp": _clamp, "clip": _clamp,
    "clamp_min": lambda tracer, x, lo: _clamp(tracer, x, lo=lo),
    "clamp_max": lambda tracer, x, hi: _clamp(tracer, x, hi=hi),
}

# Dunder names some frameworks dispatch under (torch.Tensor.__add__ and the like).
_DUNDERS = {"__add__": "add", "__radd__": "add", "__sub__": "sub", "__mul__": "mul", "__rmul__": "mul",
            "__truediv__": "div", "__pow__": "pow", "__neg__": "neg", "__abs__": "abs", "__lt__": "lt",
            "__le__": "le", "__gt__": "gt", "__ge__": "ge", "__eq__": "eq", "__ne__": "ne", "__and__": "and",
            "__or__": "or", "__invert__": "not"}


def _tracer_of(args):
    for a in args:
        if isinstance(a, Sym):
            return a.tracer
        if isinstance(a, (tuple, list)):
            found = _tracer_of(a)
            if found is not None:
                return found
    return None


def apply(name, args, kwargs):
    """A framework function `name` called on traced values (the adapters route their dispatch here)."""
    tracer = _tracer_of(args)
    if name == "__getitem__":
        return tracer.index(args[0], args[1])
    if name in ("__rsub__", "__rtruediv__", "__rpow__"):
        return _call(tracer, {"__rsub__": "sub", "__rtruediv__": "div", "__rpow__": "pow"}[name], args[1], args[0])
    if name in _DUNDERS:
        return _call(tracer, _DUNDERS[name], *args)
    rule = _FUNCTIONS.get(name)
    kwargs = dict(kwargs or {})
    if name in ("div", "divide", "true_divide") and kwargs.pop("rounding_mode", None) is not None:
        raise not_covered("division with a rounding mode")
    if name in ("clamp", "clip"):
        lo = args[1] if len(args) > 1 else kwargs.pop("min", kwargs.pop("a_min", None))
        hi = args[2] if len(args) > 2 else kwargs.pop("max", kwargs.pop("a_max", None))
        if kwargs:
            raise not_covered(f"{name} with {sorted(kwargs)}")
        return _clamp(tracer, args[0], lo, hi)
    if rule is None or kwargs:
        raise not_covered(f"{name}({', '.join(sorted(kwargs))})" if kwargs and rule else f"{name}()")
    return rule(tracer, *args)


def trace(fn, is_tensor, sym_class=None, is_learnable=lambda tensor: False):
    """Traces fn(score, b, h, q_idx, kv_idx) into a Traced modifier; `is_tensor` says which Python
    objects are the framework's tensors (the ones fn may capture and index), `sym_class` (a
    subclass of Sym) may add the framework's dispatch hook, and `is_learnable` says which tensors
    need a gradient (their terms run as the bias)."""
    tracer = _Tracer(is_tensor, sym_class or Sym, is_learnable)
    leaves = [tracer.sym_class(tracer, name) for name in _LEAVES]
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
    modifier, bias = split_bias(text, tracer)
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
    return traced


def _numbered(tracer, text):
    """The Traced of `text`, its slots renumbered in the order the text first uses them (a
    framework's own steps may have made numbers or tensors that the result does not use)."""
    scalars, tensors = [], []

    def scalar(match):
        value = tracer.scalars[int(match.group(1))]
        if value not in scalars:
            scalars.append(value)
        return f"${scalars.index(value)}"

    def tensor(match):
        entry = tracer.tensors[int(match.group(2))]
        if all(entry[0] is not seen for seen, _ in tensors):
            tensors.append(entry)
        slot = next(i for i, (seen, _) in enumerate(tensors) if seen is entry[0])
        return f"{match.group(1)}{slot}{match.group(3)}"

    text = re.sub(r"\$(\d+)", scalar, text)
    text = re.sub(r"\b([tG])(\d+)([\[(])", tensor, text)
    return Traced(text, scalars, [t for t, _ in tensors], [a for _, a in tensors])


# --- the bias part: terms added to the score that gather or need a gradient ------------------------

def parse(text):
    """An expression's tree: a leaf's text, or (operation, [arguments])."""
    at = 0

    def node():
        nonlocal at
        start = at
        while at < len(text) and text[at] not in "(),[":
            at += 1
        if at < len(text) and text[at] == "[":  # t<slot>[axes]
            at = text.index("]", at) + 1
            return text[start:at]
        name = text[start:at]
        if at < len(text) and text[at] == "(":
            at += 1
            args = [node()]
            while text[at] == ",":
                at += 1
                args.append(node())
            at += 1  # ")"
            return name, args
        return name
    return node()


def unparse(tree):
    return tree if isinstance(tree, str) else f"{tree[0]}({','.join(unparse(a) for a in tree[1])})"


def _terms(tree, sign=1):
    """The root's sum as (sign, term) pairs: add, sub and neg flattened."""
    if isinstance(tree, tuple) and tree[0] in ("add", "sub"):
        return _terms(tree[1][0], sign) + _terms(tree[1][1], sign if tree[0] == "add" else -sign)
    if isinstance(tree, tuple) and tree[0] == "neg":
        return _terms(tree[1][0], -sign)
    return [(sign, tree)]


def _leaves(tree):
    if isinstance(tree, str):
        return {tree}
    return {tree[0]} | set().union(*(_leaves(a) for a in tree[1]))


def _summed(terms):
    out = None
    for sign, term in terms:
        if out is None:
            out = term if sign > 0 else ("neg", [term])
        else:
            out = ("add" if sign > 0 else "sub", [out, term])
    return out


def split_bias(text, tracer):
    """(the modifier's text, the bias's text or None): the root's terms that gather (G<slot>) or read
    a tensor that needs a gradient move to the bias, which must not involve the score; a modifier that
    is then the plain score is "" (none)."""
    if re.search(r"\bG\d+\(", text) is None:
        return text, None
    terms = _terms(parse(text))
    dense = [(sign, term) for sign, term in terms if any(leaf.startswith("G") for leaf in _leaves(term))]
    for _, term in dense:
        if "score" in _leaves(term):
            raise NotSupportedError(f"score_mod: {unparse(term)} gathers from a tensor or reads one that needs a "
                                    "gradient, and involves the score: such terms must be added to the score (they "
                                    "run as the call's bias, which cuDNN differentiates); G<n> is tensor n gathered (under JAX's jit "
                                    "every traced array may need a gradient: jax.lax.stop_gradient says it does not)")
    rest = [(sign, term) for sign, term in terms if (sign, term) not in dense]
    if not rest:
        raise NotSupportedError("score_mod: a function whose result does not use the score beside its gathered or "
                                "learned terms (return score + ...)")
    modifier = _summed(rest)
    return ("" if modifier == "score" else unparse(modifier)), unparse(_summed(dense))


def bias_sizes(layout, axes, q_shape, k_shape):
    """(b, h_q, s_q, s_kv) of a call whose q and k are in `layout`, for its dense bias; `axes` maps
    the dense layouts to where they hold (batch, heads, sequence, ...). NotSupportedError for
    another layout (thd)."""
    if layout not in axes:
        raise NotSupportedError(f"score_mod: a gathered or learned term (it runs as a bias) with layout={layout!r} "
                                "(bshd, sbhd or bhsd)")
    b_axis, h_axis, s_axis = axes[layout][:3]
    return q_shape[b_axis], q_shape[h_axis], q_shape[s_axis], k_shape[s_axis]


def bias_shape(shape, sizes):
    """The nearest bias shape the core takes ([b|1, h|1, s_q|1, s_kv], s_q wherever b or h are there)
    for a dense value of 4-d broadcast `shape` in a call of `sizes` (b, h_q, s_q, s_kv)."""
    b, h, s_q = (sizes[i] if shape[i] != 1 else 1 for i in range(3))
    return b, h, sizes[2] if (b > 1 or h > 1) else s_q, sizes[3]


def evaluate_dense(traced, grids, ops):
    """The value of `traced`'s expression (a bias: no score) at every index of `grids`, {"b", "h", "q",
    "kv"}: integer arrays that broadcast against each other. `ops` gives the framework's operations:
    one per operation name of fusedattn/score_mod.h (taking arrays or Python numbers), and
    "leaf" (tensor, axes) -> the tensor broadcast over [b, h, q, kv], "gather" (tensor, [integer
    indices]) -> tensor[indices], "integer" (x) -> x as integers (for gather indices)."""
    def value(tree):
        if isinstance(tree, str):
            if tree in grids:
                return grids[tree]
            if tree.startswith("$"):
                return traced.scalars[int(tree[1:])]
            if tree.startswith("t"):
                slot, axes = tree[1:].split("[")
                return ops["leaf"](traced.tensors[int(slot)], axes[:-1])
            if tree == "score":
                raise not_covered("the score inside a bias term")
            return float(tree)
        name, args = tree
        if name.startswith("G"):
            return ops["gather"](traced.tensors[int(name[1:])], [ops["integer"](value(a)) for a in args])
        return ops[name](*(value(a) for a in args))
    return value(parse(traced.text))
