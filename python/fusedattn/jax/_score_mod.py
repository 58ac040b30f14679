"""fusedattn.jax's score_mod: FlexAttention-style functions fn(score, b, h, q_idx, kv_idx) written
with jax.numpy, traced by JAX (make_jaxpr on scalars) and their jaxpr read into the core's
expressions with the framework-free builder of fusedattn/_score_mod.py: the same numbers-as-scalars
rule, arrays the function captures (constants of the jaxpr) indexed by b, h, q_idx, kv_idx as
tensor leaves, and NotSupportedError naming any primitive the expressions lack. Works under jit:
the captured arrays may be tracers of the enclosing computation. Then what a call passes for a
traced modifier: its bias terms as a dense bias, its scalars and captured arrays as operands."""
import jax
import jax.numpy as jnp
import numpy as np

from .. import _config, _mask_structure, _score_mod, _score_mod_bias, _score_mod_sym
from .._score_mod_sym import Sym, not_covered
from ..errors import NotSupportedError, invalid_argument

_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "max": "max", "min": "min", "pow": "pow",
           "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne", "and": "and", "or": "or"}
_UNARY = {"neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh",
          "logistic": "sigmoid", "not": "not", "floor": "floor", "ceil": "ceil", "sign": "sign"}
_SAME = ("squeeze", "reshape", "broadcast_in_dim", "copy", "copy_p")
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


def _integral(var):
    """Whether a jaxpr variable (or literal) holds integers."""
    return jnp.issubdtype(var.aval.dtype, jnp.integer)


def _integer_arithmetic(tracer, eqn, args):
    """The primitives whose meaning on integers differs from the expressions' real arithmetic:
    division and remainder round toward zero (lax.div, lax.rem; jnp's // and % correct them with
    sign), and a cast to an integer type rounds toward zero. None where `eqn` is none of them."""
    name = eqn.primitive.name
    if name == "convert_element_type":
        x, to, source = args[0], eqn.params["new_dtype"], eqn.invars[0].aval.dtype
        if jnp.issubdtype(to, jnp.bool_) and not jnp.issubdtype(source, jnp.bool_):
            return _score_mod_sym.call(tracer, "ne", x, 0)
        if jnp.issubdtype(to, jnp.integer) and jnp.issubdtype(source, jnp.floating):
            return _score_mod_sym.trunc(tracer, x)
        return x  # a bool as 0 or 1, an integer as a float: the same number
    if name == "rem":
        return _score_mod_sym.fmod(tracer, args[0], args[1])
    if name == "div" and _integral(eqn.outvars[0]):
        return _score_mod_sym.trunc(tracer, _score_mod_sym.call(tracer, "div", args[0], args[1]))
    return None


def _equation(tracer, eqn, args):
    name = eqn.primitive.name
    params = eqn.params
    if name in _SAME:
        return args[0]
    integer = _integer_arithmetic(tracer, eqn, args)
    if integer is not None:
        return integer
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
        return _score_mod_sym.call(tracer, "select", pred, if_true, if_false)
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
        return _score_mod_sym.call(tracer, "pow", args[0], int(params["y"]))
    if name == "square":
        return _score_mod_sym.call(tracer, "mul", args[0], args[0])
    if name == "rsqrt":
        return _score_mod_sym.call(tracer, "div", 1.0, _score_mod_sym.call(tracer, "sqrt", args[0]))
    if name in _UNARY:
        return _score_mod_sym.call(tracer, _UNARY[name], args[0])
    if name in _BINARY:
        return _score_mod_sym.call(tracer, _BINARY[name], args[0], args[1])
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


def with_mask(score_mod, mask_mod):
    """FlexAttention's mask_mod(b, h, q_idx, kv_idx) -> bool beside score_mod (or none): the modified
    score where the mask keeps a key, -inf where it does not."""
    def masked(score, b, h, q_idx, kv_idx):
        kept = score if score_mod is None else score_mod(score, b, h, q_idx, kv_idx)
        return jnp.where(mask_mod(b, h, q_idx, kv_idx), kept, -jnp.inf)
    return masked


def trace_masked(score_mod, mask_mod):
    """trace() of score_mod (or none) under mask_mod: each traced apart and composed
    (fusedattn/_score_mod.under_mask), so that the modifier's gathered terms stay its bias."""
    modifier, stopped = trace(score_mod) if score_mod is not None else (None, set())
    mask, mask_stopped = trace(with_mask(None, mask_mod))
    return _score_mod.under_mask(modifier, mask), set(stopped) | set(mask_stopped)


def mask_band(mask_mod):
    """The left bound of cuDNN's band mask that mask_mod is (-1: causal), or None."""
    mask, _ = trace(with_mask(None, mask_mod))
    found = _mask_structure.structure(mask.text, mask.scalars)
    return found.left if isinstance(found, _mask_structure.Band) else None


def trace(fn):
    """The Traced modifier of fn, its captured arrays as they are (concrete or tracers), and the ids
    of those it took through stop_gradient."""
    scalars = (jax.ShapeDtypeStruct((), jnp.float32),) + tuple(jax.ShapeDtypeStruct((), jnp.int32) for _ in range(4))
    closed = jax.make_jaxpr(fn)(*scalars)
    tracer = _score_mod.Tracer(lambda x: hasattr(x, "shape"), Sym)
    tracer.stopped = set()
    tracer.is_learnable = lambda array: learned(array, tracer.stopped)
    leaves = [Sym(tracer, name) for name in _score_mod.LEAVES]
    out = _evaluate(tracer, closed.jaxpr, closed.consts, leaves)
    if isinstance(out, list):
        raise not_covered("a function with several results")
    return _score_mod.finish(tracer, out), tracer.stopped


def _differentiated(array):
    """Whether a captured array may be differentiated: any traced value. Inside jit, JAX traces the
    function before it differentiates the result (jax.vjp of a jitted function hands the function
    jaxpr tracers, never JVP tracers: JAX 0.11 on the H200 gave a learned table a zero gradient
    when only JVP tracers counted), so a traced array cannot be told apart from one that will be
    differentiated. jax.lax.stop_gradient on it says it is not learned, and keeps it a tensor of
    the modifier."""
    return isinstance(array, jax.core.Tracer)


def learned(array, stopped):
    """Whether a captured array is taken as learned: it may be differentiated, and the function did
    not take it through stop_gradient (`stopped`: those arrays' ids, from trace())."""
    return _differentiated(array) and id(array) not in stopped


def dense_bias(part, q, k, *, layout, stopped=()):
    """The bias of a traced bias part (_score_mod_bias.py): its expression at every (b, h, q_idx, kv_idx)
    of this call, in q's dtype, in the nearest bias shape the core takes (_score_mod_bias.bias_shape),
    differentiable in the arrays it reads; and whether any of them may be differentiated (traced,
    and not taken through stop_gradient, whose ids are `stopped`: then the call computes dBias)."""
    sizes = _score_mod_bias.bias_sizes(layout, _config.AXES, q.shape, k.shape)
    grids = {name: jnp.arange(n, dtype=jnp.int32).reshape((1,) * axis + (n,) + (1,) * (3 - axis))
             for axis, (name, n) in enumerate(zip(("b", "h", "q", "kv"), sizes))}
    value = jnp.asarray(_score_mod_bias.evaluate_dense(part, grids, _operations(sizes)), jnp.float32)
    value = value.reshape((1,) * (4 - value.ndim) + value.shape)
    bias = jnp.broadcast_to(value, _score_mod_bias.bias_shape(value.shape, sizes)).astype(q.dtype)
    return bias, any(learned(t, stopped) for t in part.tensors)


def with_modifier_bias(traced, q, k, *, layout, stopped, bias, bias_grad):
    """(bias, bias_grad) of a call whose modifier has bias terms (its gathered or learned terms,
    added to the score as a bias): the given bias plus the terms' dense bias, differentiated where
    the given one was or a term is learned."""
    mod_bias, learned_terms = dense_bias(traced.bias, q, k, layout=layout, stopped=stopped)
    mod_bias = mod_bias if learned_terms else jax.lax.stop_gradient(mod_bias)
    given_grad = bias is not None and bias_grad
    if bias is not None and not bias_grad:
        bias = jax.lax.stop_gradient(bias)
    return (mod_bias if bias is None else bias + mod_bias), given_grad or learned_terms


def operands(traced, spec, *, stopped):
    """A traced modifier's operands: its scalars (float32 [n]) and its captured arrays (float32),
    each of the shape its indices span in this call (`spec`), not differentiated (an array under
    differentiation that the function did not stop_gradient is refused)."""
    if traced is None:
        return ()
    arrays = (jnp.asarray(traced.scalars, jnp.float32),) if traced.scalars else ()
    for slot, array in enumerate(traced.tensors):
        if learned(array, stopped):
            raise NotSupportedError(f"score_mod: captured array t{slot} is being differentiated: gradients of arrays "
                                    "inside a score modifier are not built yet (stop_gradient it, or pass it as bias=)")
        want = tuple(spec.score_mod_tensor_shape(slot))
        if tuple(array.shape) != want:
            raise invalid_argument(f"score_mod.t{slot}.shape", tuple(array.shape),
                                   f"shape {want}, the sizes its indices span in this call")
        arrays += (jax.lax.stop_gradient(jnp.asarray(array, jnp.float32)),)
    return arrays


def _operations(sizes):
    def array(x):
        return jnp.asarray(x, jnp.float32) if isinstance(x, (int, float)) else x

    def leaf(t, axes):
        named = axes.split(",")
        return jnp.asarray(t, jnp.float32).reshape([n if name in named else 1
                                                    for name, n in zip(("b", "h", "q", "kv"), sizes)])

    def integer(x):
        if isinstance(x, (int, float)):
            return int(x)
        return jnp.round(x).astype(jnp.int32) if jnp.issubdtype(x.dtype, jnp.floating) else x

    unary = {"neg": jnp.negative, "abs": jnp.abs, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt,
             "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "not": jnp.logical_not,
             # on a condition too (a bool cast to an integer): as the 0 or 1 it stands for
             "floor": lambda x: jnp.floor(jnp.asarray(x, jnp.float32)),
             "ceil": lambda x: jnp.ceil(jnp.asarray(x, jnp.float32)),
             "trunc": lambda x: jnp.trunc(jnp.asarray(x, jnp.float32)),
             "sign": lambda x: jnp.sign(jnp.asarray(x, jnp.float32))}
    ops = {name: (lambda f: lambda x: f(array(x)))(f) for name, f in unary.items()}
    binary = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.true_divide, "pow": jnp.power,
              "min": jnp.minimum, "max": jnp.maximum, "and": jnp.logical_and, "or": jnp.logical_or,
              "lt": jnp.less, "le": jnp.less_equal, "gt": jnp.greater, "ge": jnp.greater_equal, "eq": jnp.equal,
              "ne": jnp.not_equal}
    ops.update({name: (lambda f: lambda x, y: f(array(x), array(y)))(f) for name, f in binary.items()})
    ops["select"] = lambda c, x, y: jnp.where(array(c) != 0, array(x), array(y))
    # jnp's gather clamps indices into range, as the dynamic_slice the function's indexing traced to does.
    ops.update(leaf=leaf, integer=integer, gather=lambda t, indices: jnp.asarray(t)[tuple(indices)])
    return ops
