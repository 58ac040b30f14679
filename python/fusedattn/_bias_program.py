"""A bias's expression (fusedattn/_score_mod_bias.py) as a program of its distinct subexpressions,
run with a framework's operations over index grids. Framework-free.

A traced function's text is a tree without sharing: a value used twice (T5's |kv - q|, under a
comparison, a where and a log) is written, and would be computed, at each use. Here each distinct
subexpression is one step, computed once and dropped after its last use. Steps that depend on the
indices and numbers alone (T5's bucket of kv - q, with its bucket counts) give the same values at
every call of one size and the same numbers; a caller may keep those that feed the rest (the
"index values") from one call to the next, and a call then computes only what reads tensors: for
a relative-position table, the gather."""
from . import _core as core
from ._score_mod_sym import not_covered

GRIDS = ("b", "h", "q", "kv")


class Program:
    """`steps[i]`: (kind, payload, argument positions), each after those it reads: ("q", None, ()),
    ("constant", 2.0, ()), ("scalar", slot, ()), ("tensor", (slot, axes), ()), ("gather", slot,
    indices) or (operation, None, arguments). `index_values`: the positions of steps that depend on
    the indices, constants and scalars alone and are read by a step that does not (or are the root)."""
    __slots__ = ("steps", "index_values")

    def __init__(self, tree):
        self.steps, positions = [], {}

        def visit(node):  # children first, so every step comes after those it reads
            kind = node[0]
            if kind == "gather":
                step = (kind, node[1], tuple(visit(index) for index in node[2]))
            elif kind == "tensor":
                step = (kind, (node[1], node[2]), ())
            elif kind in ("constant", "scalar"):
                step = (kind, node[1], ())
            elif len(node) == 1:  # score, b, h, q, kv
                step = (kind, None, ())
            else:
                step = (kind, None, tuple(visit(argument) for argument in node[1]))
            # Constants by their text, so that -0.0 and 0.0 (equal as numbers) stay two values.
            key = (kind, repr(step[1]), step[2]) if kind == "constant" else step
            if key not in positions:
                positions[key] = len(self.steps)
                self.steps.append(step)
            return positions[key]

        visit(tree)
        on_indices = []
        for kind, _, arguments in self.steps:
            leaf = kind in GRIDS or kind in ("constant", "scalar")
            on_indices.append(leaf or (kind not in ("tensor", "gather", "score") and bool(arguments) and
                                       all(on_indices[a] for a in arguments)))
        read_by_rest = {a for at, (_, _, arguments) in enumerate(self.steps) if not on_indices[at] for a in arguments}
        root = len(self.steps) - 1
        self.index_values = frozenset(at for at, (_, _, arguments) in enumerate(self.steps)
                                      if on_indices[at] and arguments and (at in read_by_rest or at == root))

    def run(self, traced, grids, ops, kept=None):
        """The root's value (_score_mod_bias.evaluate_dense says what `grids` and `ops` are). With
        `kept` (a mutable mapping for these grids and traced.scalars), index values found there are
        not computed, and those computed are put there."""
        have = () if kept is None else {at for at in self.index_values if at in kept}
        needed = [False] * len(self.steps)
        needed[-1] = True
        for at in reversed(range(len(self.steps))):
            if needed[at] and at not in have:
                for argument in self.steps[at][2]:
                    needed[argument] = True
        last_use = {}
        for at, (_, _, arguments) in enumerate(self.steps):
            if needed[at] and at not in have:
                for argument in arguments:
                    last_use[argument] = at
        root = len(self.steps) - 1
        values = [None] * len(self.steps)
        for at, (kind, payload, arguments) in enumerate(self.steps):
            if not needed[at]:
                continue
            if at in have:
                values[at] = kept[at]
                continue
            values[at] = self._value(kind, payload, arguments, values, traced, grids, ops, root=at == root)
            if kept is not None and at in self.index_values:
                kept[at] = values[at]
            for argument in arguments:
                if last_use.get(argument) == at:
                    values[argument] = None
        return values[root]

    @staticmethod
    def _value(kind, payload, arguments, values, traced, grids, ops, *, root):
        if kind in grids:
            return grids[kind]
        if kind == "constant":
            return payload
        if kind == "scalar":
            return traced.scalars[payload]
        if kind == "tensor":
            return ops["leaf"](traced.tensors[payload[0]], payload[1])
        if kind == "gather":
            gather = ops.get("root gather", ops["gather"]) if root else ops["gather"]
            return gather(traced.tensors[payload], [ops["integer"](values[index]) for index in arguments])
        if kind == "score":
            raise not_covered("the score inside a bias term")
        return ops[kind](*(values[argument] for argument in arguments))


_programs = {}  # a bias's text -> its Program; one entry per structure of a traced function (numbers are slots)
_PROGRAMS_KEPT = 1024


def bias_program(text):
    """The Program of a bias's text (from the core's tree, _core.score_expression_tree), kept by its
    text: compiled code (torch.compile) rebuilds a traced part from its text and cannot call into
    the compiled core while it traces, so the tracer asks here once, eagerly, and compiled code finds
    the program. Bounded: past _PROGRAMS_KEPT structures the oldest goes (a structure is one traced
    function's, not one per call)."""
    program = _programs.get(text)
    if program is None:
        if len(_programs) >= _PROGRAMS_KEPT:
            del _programs[next(iter(_programs))]
        program = _programs[text] = Program(core.score_expression_tree(text))
    return program
