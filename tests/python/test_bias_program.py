"""fusedattn/_bias_program.py without a GPU or a framework: a bias's tree run as its distinct
subexpressions, each computed once, equal to the tree evaluated node by node; index values kept
between calls, so that a later call computes only what reads tensors; -0.0 and 0.0 kept apart."""
import collections
import math

import numpy as np
import pytest

from fusedattn import _bias_program, _core, _score_mod_bias

# T5's bucket of kv - q gathered from table 0 at (bucket, h), as the tracer writes it ($n: numbers).
T5 = ("G0(add(mul(trunc(gt(sub(kv,q),0)),$0),select(lt(abs(sub(kv,q)),$1),abs(sub(kv,q)),"
      "min(add($1,trunc(mul(div(log(div(abs(sub(kv,q)),$1)),$2),$1))),$3))),h)")
T5_SCALARS = [16.0, 8.0, 1.0 / math.log(128 / 8), 15.0]


class Traced:
    def __init__(self, text, scalars, tensors):
        self.text, self.scalars, self.tensors = text, scalars, tensors


def counting_ops(calls):
    """numpy operations for evaluate_dense, each call counted by name in `calls`."""
    plain = {"neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
             "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "sign": np.sign, "add": np.add,
             "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "pow": np.power, "min": np.minimum,
             "max": np.maximum, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
             "eq": np.equal, "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or,
             "not": np.logical_not, "select": lambda c, x, y: np.where(np.asarray(c) != 0, x, y),
             "integer": lambda x: np.round(x).astype(np.int64),
             "gather": lambda t, indices: t[tuple(indices)], "leaf": lambda t, axes: t}

    def counted(name, f):
        def call(*args):
            calls[name] += 1
            with np.errstate(divide="ignore", invalid="ignore"):
                return f(*(np.asarray(a, dtype=np.float64) if isinstance(a, bool) else a for a in args))
        return call
    return {name: counted(name, f) for name, f in plain.items()}


def grids(s_q, s_kv, heads):
    return {"b": np.zeros((1, 1, 1, 1), np.int64), "h": np.arange(heads).reshape(1, heads, 1, 1),
            "q": np.arange(s_q).reshape(1, 1, s_q, 1), "kv": np.arange(s_kv).reshape(1, 1, 1, s_kv)}


def node_by_node(tree, traced, grid, ops):
    """The tree evaluated as it is written: every node at every use."""
    kind = tree[0]
    if kind in grid:
        return grid[kind]
    if kind == "constant":
        return tree[1]
    if kind == "scalar":
        return traced.scalars[tree[1]]
    if kind == "gather":
        return ops["gather"](traced.tensors[tree[1]],
                             [ops["integer"](node_by_node(i, traced, grid, ops)) for i in tree[2]])
    return ops[kind](*(node_by_node(a, traced, grid, ops) for a in tree[1]))


def t5():
    rng = np.random.default_rng(0)
    return Traced(T5, T5_SCALARS, [rng.standard_normal((32, 4))])


def test_each_distinct_subexpression_is_computed_once_with_the_trees_value():
    traced, grid = t5(), grids(40, 300, 4)
    tree_calls, program_calls = collections.Counter(), collections.Counter()
    want = node_by_node(_core.score_expression_tree(T5), traced, grid, counting_ops(tree_calls))
    got = _score_mod_bias.evaluate_dense(traced, grid, counting_ops(program_calls))
    assert np.array_equal(got, want) and got.shape == (1, 4, 40, 300)
    # |kv - q| is written three times and kv - q four: each is computed once.
    assert tree_calls["sub"] == 4 and tree_calls["abs"] == 3
    assert program_calls["sub"] == 1 and program_calls["abs"] == 1
    steps = _bias_program.bias_program(T5).steps
    operations = [step for step in steps if step[2]]
    assert sum(program_calls.values()) == len(operations) + 2  # and integer() of the gather's two indices
    assert len({step for step in steps}) == len(steps)


def test_index_values_are_kept_and_a_later_call_only_gathers():
    traced, grid = t5(), grids(33, 70, 4)
    kept, first, second = {}, collections.Counter(), collections.Counter()
    want = _score_mod_bias.evaluate_dense(traced, grid, counting_ops(collections.Counter()))
    assert np.array_equal(_score_mod_bias.evaluate_dense(traced, grid, counting_ops(first), kept), want)
    program = _bias_program.bias_program(T5)
    # The bucket is the one index value read by the gather; h is a grid.
    assert set(kept) == set(program.index_values) and len(kept) == 1
    traced.tensors = [traced.tensors[0] * 3.0]  # a new table: its values are read again
    got = _score_mod_bias.evaluate_dense(traced, grid, counting_ops(second), kept)
    assert np.array_equal(got, want * 3.0)
    assert second == collections.Counter({"integer": 2, "gather": 1})


def test_zero_and_negative_zero_stay_two_constants():
    text = "add(G0(kv),div(1,add(q,-0)))"
    traced = Traced(text, [], [np.arange(5.0)])
    grid = grids(1, 5, 1)
    got = _score_mod_bias.evaluate_dense(traced, grid, counting_ops(collections.Counter()))
    want = node_by_node(_core.score_expression_tree(text), traced, grid, counting_ops(collections.Counter()))
    assert np.array_equal(got, want)
    text = "add(div(1,add(q,-0)),G0(div(1,add(kv,0))))"
    program = _bias_program.bias_program(text)
    constants = [step for step in program.steps if step[0] == "constant"]
    assert len(constants) == len({repr(step[1]) for step in constants})


def test_programs_are_bounded(monkeypatch):
    monkeypatch.setattr(_bias_program, "_programs", {})
    monkeypatch.setattr(_bias_program, "_PROGRAMS_KEPT", 3)
    for n in range(5):
        _bias_program.bias_program(f"G0(add(kv,{n}))")
    assert list(_bias_program._programs) == [f"G0(add(kv,{n}))" for n in (2, 3, 4)]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
