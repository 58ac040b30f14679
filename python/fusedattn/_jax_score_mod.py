"""fusedattn.jax's score_mod: FlexAttention-style functions fn(score, b, h, q_idx, kv_idx) written
with jax.numpy, traced by JAX (make_jaxpr on scalars) and their jaxpr read into the core's
expressions with the framework-free builder of _score_mod.py: the same numbers-as-scalars rule,
arrays the function captures (constants of the jaxpr) indexed by b, h, q_idx, kv_idx as tensor
leaves, and NotSupportedError naming any primitive the expressions lack. Works under jit: the
captured arrays may be tracers of the enclosing computation."""
import jax
import jax.numpy as jnp
import numpy as np

from . import _score_mod
from ._score_mod import Sym, not_covered

_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "max": "max", "min": "min", "pow": "pow",
           "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne", "and": "and", "or": "or"}
_UNARY = {"neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh",
          "logistic": "sigmoid", "not": "not"}
_SAME = ("convert_element_type", "squeeze", "reshape", "broadcast_in_dim", "copy", "copy_p")
_CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint")
_LEAF_INDICES = ("b", "h", "q", "kv")


class _Captured:
    """An array the function captured (a constant of its jaxpr), to be indexed; `stopped` once the
    function applied stop_gradient to it."""
    __slots__ = ("array", "stopped")

    def __init__(self, array, stopped=False):
        self.array, self.stopped = array, stopped


def _number(literal):
    value = np.asarray(literal)
    if value.dtype == np.bool_:
        return bool(value)
    return float(value) if np.issubdtype(value.dtype, np.floating) else int(value)


def _is_leaf_index(x):
    return isinstance(x, Sym) and x.text in _LEAF_INDICES


def _inner(params):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        inner = params.get(key)
        if inner is not None:
            return (inner.jaxpr, inner.consts) if hasattr(inner, "jaxpr") else (inner, ())
    raise not_covered("a call without a jaxpr")


def _equation(tracer, eqn, args):
    name = eqn.primitive.name
    params = eqn.params
    if name in _SAME:
        return args[0]
    if name == "stop_gradient":
        return _Captured(args[0].array, True) if isinstance(args[0], _Captured) else args[0]
    if name in _CALLS:
        jaxpr, consts = _inner(params)
        return _evaluate(tracer, jaxpr, consts, args)
    if name == "select_n":
        if len(args) != 3:
            raise not_covered(f"select_n of {len(args) - 1} cases")
        pred, if_false, if_true = args
        if isinstance(pred, (bool, int, float)) and not isinstance(pred, Sym):
            return if_true if pred else if_false
        return _score_mod._call(tracer, "select", pred, if_true, if_false)
    if name == "lt" and _is_leaf_index(args[0]) and args[1] == 0:
        return False  # an index is never negative: JAX's wrap-around of negative indices folds away
    if name == "dynamic_slice":
        operand, indices = args[0], args[1:]
        if not isinstance(operand, _Captured) or any(size != 1 for size in params["slice_sizes"]):
            raise not_covered("a slice of a value of the function (index captured arrays by b, h, q_idx, kv_idx)")
        if operand.stopped:
            tracer.stopped.add(id(operand.array))
        return tracer.index(operand.array, tuple(indices))
    if name == "integer_pow":
        return _score_mod._call(tracer, "pow", args[0], int(params["y"]))
    if name == "square":
        return _score_mod._call(tracer, "mul", args[0], args[0])
    if name == "rsqrt":
        return _score_mod._call(tracer, "div", 1.0, _score_mod._call(tracer, "sqrt", args[0]))
    if name in _UNARY:
        return _score_mod._call(tracer, _UNARY[name], args[0])
    if name in _BINARY:
        return _score_mod._call(tracer, _BINARY[name], args[0], args[1])
    raise not_covered(f"the JAX primitive {name}")


def _evaluate(tracer, jaxpr, consts, args):
    env = {}

    def read(var):
        if type(var).__name__ == "Literal":
            return _number(var.val)
        return env[var]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = _Captured(value)
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        out = _equation(tracer, eqn, [read(v) for v in eqn.invars])
        if len(eqn.outvars) != 1:
            raise not_covered(f"the JAX primitive {eqn.primitive.name} with {len(eqn.outvars)} results")
        env[eqn.outvars[0]] = out
    outs = [read(v) for v in jaxpr.outvars]
    return outs[0] if len(outs) == 1 else outs


def trace(fn):
    """The Traced modifier of fn, its captured arrays as they are (concrete or tracers), and the ids
    of those it took through stop_gradient."""
    scalars = (jax.ShapeDtypeStruct((), jnp.float32),) + tuple(jax.ShapeDtypeStruct((), jnp.int32) for _ in range(4))
    closed = jax.make_jaxpr(fn)(*scalars)
    tracer = _score_mod._Tracer(lambda x: hasattr(x, "shape"), Sym)
    tracer.stopped = set()
    leaves = [Sym(tracer, name) for name in _score_mod._LEAVES]
    out = _evaluate(tracer, closed.jaxpr, closed.consts, leaves)
    if isinstance(out, list):
        raise not_covered("a function with several results")
    return _score_mod.finish(tracer, out), tracer.stopped
