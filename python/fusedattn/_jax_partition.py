"""Sharding of fusedattn.jax's calls (jax.experimental.custom_partitioning).

Under a mesh, each call runs once per device on that device's shard of the batch and of the
heads (data- and head-parallel), so q, k and v are never gathered. A call needs whole sequences
and whole head dimensions, so shardings of those axes are undone (replicated) first, and so are
head shardings the K/V heads cannot follow (h_kv not divisible by the mesh axes' size): GQA
keeps each query head with its K/V head only when both are split alike.

Each array of a call has a role: "q", "k", "v", "o", "d_o", "d_q", "d_k", "d_v" in the call's
layout, or "stats" ([b, h_q, s_q]).
"""
import functools
import math

from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from . import _layouts

STATS = "stats"
_KV = ("k", "v", "d_k", "d_v")
_V_DIM = ("v", "o", "d_o", "d_v")


def _logical_letters(role, grouping):
    """Shardy factor names for the role's logical (batch, heads, seq, dim) axes. `grouping`:
    "same" (h_q = h_kv), "grouped" (GQA: query heads = K/V heads x group size) or "single" (MQA:
    one K/V head, which Shardy cannot write as a compound factor of size 1, nor can it be split)."""
    q_heads = {"same": "g", "grouped": "(g r)", "single": "h"}[grouping]
    if role == STATS:
        return ("b", q_heads, "s", None)
    return ("b", "g" if role in _KV else q_heads, "t" if role in _KV else "s", "e" if role in _V_DIM else "d")


def _in_array_order(role, layout, logical):
    """Per array axis, the entry of `logical` (batch, heads, seq, dim) it holds."""
    if role == STATS:
        return tuple(logical[:3])
    order = [None] * 4
    for index, axis in enumerate(_layouts.AXES[layout]):
        order[axis] = logical[index]
    return tuple(order)


def sharding_rule(layout, inputs, outputs, grouping):
    """The einsum-like rule Shardy propagates with: batch and heads pass through; sequences and
    head dims are to be replicated."""
    def operand(role):
        return " ".join(_in_array_order(role, layout, _logical_letters(role, grouping)))
    return f"{', '.join(map(operand, inputs))} -> {', '.join(map(operand, outputs))}"


def _in_rule_order(rule, factors):
    """`factors` in the order they first appear in `rule` (Shardy wants special factors sorted)."""
    tokens = rule.replace("(", " ").replace(")", " ").replace(",", " ").split()
    return tuple(sorted((f for f in factors if f in tokens), key=tokens.index))


def _mesh_size(mesh, axes):
    if axes is None:
        return 1
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[name] for name in names)


def _shardings(mesh, layout, q_sharding, h_kv, roles):
    """Each role's sharding: q's batch and head shardings (the head one only where h_kv follows),
    nothing else."""
    spec = tuple(q_sharding.spec) + (None,) * 4 if isinstance(q_sharding, NamedSharding) else (None,) * 4
    batch_axis, head_axis = _layouts.AXES[layout][0], _layouts.AXES[layout][1]
    batch, heads = spec[batch_axis], spec[head_axis]
    if heads is not None and h_kv % _mesh_size(mesh, heads):
        heads = None
    return [NamedSharding(mesh, PartitionSpec(*_in_array_order(role, layout, (batch, heads, None, None))))
            for role in roles]


@functools.lru_cache(maxsize=None)
def partitioned(kernels, kind, config, inputs, outputs, heads_q, heads_kv):
    """The `kind` kernel, `kernels(kind)(*arrays, config)`, as a custom_partitioning function
    whose per-device call sees the device's shard. The kernel is looked up when the call is
    traced or lowered, so tests can substitute reference kernels."""
    layout = config[0]
    single = len(outputs) == 1

    def kernel():
        return kernels(kind)

    @custom_partitioning
    def call(*arrays):
        return kernel()(*arrays, config)

    def choose(mesh, arg_shapes):
        q = arg_shapes[0].sharding
        return _shardings(mesh, layout, q, heads_kv, inputs), _shardings(mesh, layout, q, heads_kv, outputs)

    def partition(mesh, arg_shapes, result_shape):
        arg_shardings, result_shardings = choose(mesh, arg_shapes)
        return (mesh, lambda *shards: kernel()(*shards, config),
                result_shardings[0] if single else tuple(result_shardings), tuple(arg_shardings))

    def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
        result_shardings = choose(mesh, arg_shapes)[1]
        return result_shardings[0] if single else tuple(result_shardings)

    grouping = "same" if heads_q == heads_kv else "single" if heads_kv == 1 else "grouped"
    rule = sharding_rule(layout, inputs, outputs, grouping)
    call.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands, sharding_rule=rule,
                       need_replication_factors=_in_rule_order(rule, ("s", "t", "d", "e", "h")),
                       **({"r": heads_q // heads_kv} if grouping == "grouped" else {}))
    return call
