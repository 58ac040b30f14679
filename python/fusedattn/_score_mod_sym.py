"""The symbolic values of a traced score function (_score_mod.py traces it): Sym, whose operators and
methods write the core's expression text, and the framework functions (torch.tanh, jnp.where, their
methods and dunders) by name with what each becomes. Framework-free; anything the core's expressions
lack raises NotSupportedError naming it (not_covered)."""
from .errors import NotSupportedError


def not_covered(what):
    return NotSupportedError(f"score_mod: {what} is not covered by fusedattn's score modifiers "
                             "(the operations of fusedattn/score_mod.h: arithmetic, tanh, exp, log, sqrt, "
                             "sigmoid, abs, min, max, floor, ceil, trunc, sign, integer casts, //, %, "
                             "comparisons, logic and where)")


def call(tracer, op, *args):
    """The Sym of operation `op` (a name of fusedattn/score_mod.h's grammar) on `args`, traced values
    or numbers, in `tracer` (_score_mod.Tracer)."""
    if op == "pow" and _small_whole(args[1]):
        # A whole power 2 .. 8 stays in the structure: the graph layer makes it a product, which takes
        # negative bases (cuDNN's own power does not).
        return tracer.sym_class(tracer, f"pow({tracer.operand(args[0])},{int(args[1])})")
    return tracer.sym_class(tracer, f"{op}({','.join(tracer.operand(a) for a in args)})")


def trunc(tracer, x):
    """Rounding toward zero, as an integer cast does (.long(), .int(), astype(int32))."""
    return call(tracer, "trunc", x)


def floor_divide(tracer, x, y):
    return call(tracer, "floor", call(tracer, "div", x, y))


def remainder(tracer, x, y):
    """x - floor(x / y) * y: Python's % and torch.remainder, the sign of the divisor."""
    return call(tracer, "sub", x, call(tracer, "mul", floor_divide(tracer, x, y), y))


def fmod(tracer, x, y):
    """x - trunc(x / y) * y: C's remainder (torch.fmod, lax.rem), the sign of the dividend."""
    return call(tracer, "sub", x, call(tracer, "mul", trunc(tracer, call(tracer, "div", x, y)), y))


def _cast(tracer, x, dtype):
    """x as `dtype`: an integer type rounds toward zero, bool is x != 0, a float type is x itself
    (dtypes as PyTorch has them: torch.int64 and the like; anything else, a device or a float
    type, changes no value)."""
    if getattr(dtype, "is_floating_point", True) or getattr(dtype, "is_complex", False):
        return x
    if str(dtype).endswith("bool"):
        return call(tracer, "ne", x, 0)
    return trunc(tracer, x)


def _small_whole(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and float(x).is_integer() and 2 <= x <= 8


class Sym:
    """A symbolic value of the traced function: operators build the expression."""
    __slots__ = ("tracer", "text")

    def __init__(self, tracer, text):
        self.tracer, self.text = tracer, text

    def _op(self, op, *others):
        return call(self.tracer, op, self, *others)

    def _rop(self, op, other):
        return call(self.tracer, op, other, self)

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

    __floordiv__ = lambda self, o: floor_divide(self.tracer, self, o)
    __rfloordiv__ = lambda self, o: floor_divide(self.tracer, o, self)
    __mod__ = lambda self, o: remainder(self.tracer, self, o)
    __rmod__ = lambda self, o: remainder(self.tracer, o, self)

    def __getattr__(self, name):
        # Tensor methods (score.tanh(), score.clamp(max=...)) as the functions of the same name.
        if name in _FUNCTIONS:
            return lambda *args, **kwargs: apply(name, (self,) + args, kwargs)
        if name == "to":  # .to(torch.int64), .to(device), .to(other_tensor, ...)
            return lambda *args, **kwargs: _cast(self.tracer, self, kwargs.get("dtype", args[0] if args else None))
        if name in ("float", "double", "half", "bfloat16", "type_as", "contiguous", "clone", "detach"):
            return lambda *args, **kwargs: self
        raise not_covered(f"the method .{name}()")


def _clamp(tracer, x, lo=None, hi=None):
    out = x
    if lo is not None:
        out = call(tracer, "max", out, lo)
    if hi is not None:
        out = call(tracer, "min", out, hi)
    return out


def _where(tracer, cond, a, b):
    return call(tracer, "select", cond, a, b)


def _unary(op):
    return lambda tracer, x: call(tracer, op, x)


def _binary(op):
    return lambda tracer, x, y: call(tracer, op, x, y)


# Functions by name (torch.tanh, Tensor.tanh and their jax.numpy namesakes) and what they become.
_FUNCTIONS = {
    "tanh": _unary("tanh"), "exp": _unary("exp"), "log": _unary("log"), "sqrt": _unary("sqrt"),
    "sigmoid": _unary("sigmoid"), "abs": _unary("abs"), "absolute": _unary("abs"), "neg": _unary("neg"),
    "negative": _unary("neg"), "logical_not": _unary("not"), "bitwise_not": _unary("not"),
    "rsqrt": lambda tracer, x: call(tracer, "div", 1.0, call(tracer, "sqrt", x)),
    "square": lambda tracer, x: call(tracer, "mul", x, x),
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
    # Index arithmetic (T5's buckets, block ids): floors, casts to integers, //, %.
    "floor": _unary("floor"), "ceil": _unary("ceil"), "trunc": trunc, "fix": trunc, "sign": _unary("sign"),
    "long": trunc, "int": trunc, "short": trunc, "bool": lambda tracer, x: call(tracer, "ne", x, 0),
    "floor_divide": floor_divide, "remainder": remainder, "fmod": fmod,
    "__floordiv__": floor_divide, "__rfloordiv__": lambda tracer, x, y: floor_divide(tracer, y, x),
    "__mod__": remainder, "__rmod__": lambda tracer, x, y: remainder(tracer, y, x),
    "full_like": lambda tracer, x, value: value,
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
        return call(tracer, {"__rsub__": "sub", "__rtruediv__": "div", "__rpow__": "pow"}[name], args[1], args[0])
    if name in _DUNDERS:
        return call(tracer, _DUNDERS[name], *args)
    rule = _FUNCTIONS.get(name)
    kwargs = dict(kwargs or {})
    if name in ("div", "divide", "true_divide") and kwargs.get("rounding_mode") is not None:
        mode = kwargs.pop("rounding_mode")
        if mode not in ("floor", "trunc"):
            raise not_covered(f"division with rounding_mode={mode!r}")
        quotient = call(tracer, "div", *args)
        return call(tracer, "floor", quotient) if mode == "floor" else trunc(tracer, quotient)
    if name == "to":
        return _cast(tracer, args[0], kwargs.get("dtype", args[1] if len(args) > 1 else None))
    if name == "full_like":
        return args[1] if len(args) > 1 else kwargs["fill_value"]
    if name in ("min", "max") and len(args) == 2:  # torch.min(a, b): element-wise
        return call(tracer, name, *args)
    if name in ("clamp", "clip"):
        lo = args[1] if len(args) > 1 else kwargs.pop("min", kwargs.pop("a_min", None))
        hi = args[2] if len(args) > 2 else kwargs.pop("max", kwargs.pop("a_max", None))
        if kwargs:
            raise not_covered(f"{name} with {sorted(kwargs)}")
        return _clamp(tracer, args[0], lo, hi)
    if rule is None or kwargs:
        raise not_covered(f"{name}({', '.join(sorted(kwargs))})" if kwargs and rule else f"{name}()")
    return rule(tracer, *args)
