"""The bias part of a traced score function: terms added to the score that gather from a tensor (a
relative-position table indexed by a clamped key-minus-query distance) or read a tensor that needs a
gradient cannot run inside cuDNN's score graph, which has no gather and gives no gradient of its
operands. They come apart as the call's bias (split_bias, the core's split of the expression:
fusedattn/score_expression.h), evaluated densely by the adapter with its framework's operations on
index grids (evaluate_dense, over the core's tree of the expression), so the framework's autodiff
takes the bias's gradient, which cuDNN computes as dBias, back into the tables. In the bias's text a
gather is G<slot>(index, ...). Framework-free."""
from . import _core as core
from ._bias_program import bias_program
from .errors import NotSupportedError


def split_bias(text):
    """(the modifier's text, the bias's text or None) of a traced expression: the root's terms that
    gather (G<slot>) move to the bias, which must not involve the score; a modifier that is (then)
    the plain score is "" (none: the call runs as plain attention, with no score graph to build)."""
    terms = core.split_gathered_terms(text)
    if not terms.gathered:
        return ("" if text == "score" else text), None
    if terms.gathered_with_score:
        raise NotSupportedError(f"score_mod: {terms.gathered_with_score} gathers from a tensor or reads one that "
                                "needs a gradient, and involves the score: such terms must be added to the score "
                                "(they run as the call's bias, which cuDNN differentiates); G<n> is tensor n "
                                "gathered (under JAX's jit every traced array may need a gradient: "
                                "jax.lax.stop_gradient says it does not)")
    if not terms.rest:
        raise NotSupportedError("score_mod: a function whose result does not use the score beside its gathered or "
                                "learned terms (return score + ...)")
    return ("" if terms.rest == "score" else terms.rest), terms.gathered


def by_distance(text):
    """Whether expression `text` reads the query and key positions only through their distance:
    every q and kv in it inside sub(kv,q) or sub(q,kv) (T5's bucket, a clamped relative position)."""
    rest = text.replace("sub(kv,q)", "").replace("sub(q,kv)", "")
    for separator in "(),[]":  # str methods alone: compiled code folds them, as it cannot a regex
        rest = rest.replace(separator, " ")
    return rest != text and not {"q", "kv"} & set(rest.split())


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


def evaluate_dense(traced, grids, ops, kept=None):
    """The value of `traced`'s expression (a bias: no score) at every index of `grids`, {"b", "h", "q",
    "kv"}: integer arrays that broadcast against each other. `ops` gives the framework's operations:
    one per operation name of fusedattn/score_mod.h (taking arrays or Python numbers), and
    "leaf" (tensor, axes) -> the tensor broadcast over [b, h, q, kv], "gather" (tensor, [integer
    indices]) -> tensor[indices], "integer" (x) -> x as integers (for gather indices), and optionally
    "root gather" (tensor, [integer indices]) for a gather that is the whole bias. Each distinct
    subexpression is computed once (fusedattn/_bias_program.py); `kept`, a mapping the caller keeps
    for these grids, holds the values that depend on the indices alone from one call to the next."""
    return bias_program(traced.text).run(traced, grids, ops, kept)
