"""Sharding of fusedattn.jax's calls (jax.experimental.custom_partitioning).

Under a mesh, each call runs once per device on that device's shard of the batch and of the
heads (data- and head-parallel), so q, k and v are never gathered. A call needs whole sequences
and whole head dimensions, so shardings of those axes are undone (replicated) first, and so are
head shardings the K/V heads cannot follow (h_kv not divisible by the mesh axes' size): GQA
keeps each query head with its K/V head only when both are split alike. Packed sequences (thd)
split by heads only; paged caches by heads (the page tables and lengths follow the batch). A
bias follows q on the batch and heads it has; a sink follows q's heads;
the offsets of packed sequences and dropout's seed are replicated, and dropout's offset is moved
per shard, so that no two shards draw the same mask (the backward moves it alike, so its mask is
the forward's as long as q comes to it sharded as it came to the forward). An FP8 call's scales
are replicated scalars, and the amaxes its kernels write are the max over the shards (each shard
measured its part), so every device holds the amax of the whole tensor; an FP8 cache's descales
of one a K/V head follow the K/V heads.
"""
import math
import re

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from .. import _config
from ._calls import FP8_INPUTS, FP8_OUTPUTS, STATS

_KV = ("k", "v", "d_k", "d_v")
_V_DIM = ("v", "o", "d_o", "d_v")
_REPLICATED = ("s", "t", "d", "e", "h", "bb", "hb", "sb", "z", "cq", "ck", "pages", "ps", "pg", "ms")  # never split
_FP8_SCALARS = frozenset(role for roles in (*FP8_INPUTS.values(), *FP8_OUTPUTS.values()) for role in roles)


def _axes(role, call, batch, heads, kv_heads):
    """Per array axis of the role, what it holds: `batch`, `heads` (query heads), `kv_heads`
    (each given as whatever the caller maps them to) or a name of its own for an axis that is
    not split."""
    config = call.config
    if role in _FP8_SCALARS:  # float32 [], or an FP8 cache's descales of one a K/V head
        return (kv_heads,) if config.fp8_scaling == "head" else ()
    if role in ("sink", "d_sink") or (role == "max_logit" and config.max_logit == "head"):
        return (heads,)
    if role == "rng":
        return ("z",)
    if role == "mod_scalars":
        return ("ms",)
    if role.startswith("mod_t"):  # a modifier's tensor: its axes, the batch and heads split as q's
        names = {"b": batch, "h": heads, "q": "s", "kv": "t"}
        return tuple(names[axis] for axis in config.score_mod_tensor_axes[int(role[len("mod_t"):])].split(","))
    if role in ("cu_q", "cu_kv"):
        return ("cq" if role == "cu_q" else "ck",)
    if role in ("seq_len_q", "seq_len_kv"):
        return (batch,)
    if role in ("page_table_k", "page_table_v"):
        return (batch, "pg")
    if config.kv_pages and role in ("k", "v"):  # a pool of pages: split by heads only
        return _in_layout_order(("pages", kv_heads, "ps", "e" if role == "v" else "d"), config.kv_layout)
    if role in ("bias", "d_bias"):  # a bias kind spells its dims: b|1, h|1, s|1, s (bhss, 1hss, 111s, ...)
        kind = config.bias
        return (batch if kind[0] == "b" else "bb", heads if kind[1] == "h" else "hb", "s" if kind[2] == "s" else "sb",
                "t")
    kv = role in _KV
    logical = (batch, kv_heads if kv else heads, "t" if kv else "s", "e" if role in _V_DIM else "d")
    if role in (STATS, "max_logit"):  # a row max logit is laid out like the statistics: [b, h, s], thd [t, h]
        return (logical[2], logical[1]) if call.ragged else logical[:3]
    if call.ragged:  # [tokens, heads, dim]
        return (logical[2], logical[1], logical[3])
    return _in_layout_order(logical, config.layout)


def _in_layout_order(logical, layout):
    """(batch, heads, seq, dim) entries placed on the array axes that hold them in `layout`."""
    order = [None] * 4
    for index, axis in enumerate(_config.AXES[layout]):
        order[axis] = logical[index]
    return tuple(order)


def sharding_rule(call, inputs, outputs, grouping):
    """The einsum-like rule Shardy propagates with: batch and heads pass through, everything else
    is replicated. `grouping`: "same" (h_q = h_kv), "grouped" (GQA: query heads = K/V heads x
    group size) or "single" (MQA: one K/V head, which Shardy cannot write as a compound factor of
    size 1, nor can it be split)."""
    q_heads = {"same": "g", "grouped": "(g r)", "single": "h"}[grouping]

    def operand(role):
        return " ".join(_axes(role, call, "b", q_heads, "g"))
    return f"{', '.join(map(operand, inputs))} -> {', '.join(map(operand, outputs))}"


def _in_rule_order(rule, factors):
    """`factors` in the order they first appear in `rule` (Shardy wants special factors sorted)."""
    tokens = rule.replace("(", " ").replace(")", " ").replace(",", " ").split()
    return tuple(sorted((f for f in factors if f in tokens), key=tokens.index))


def _names(axes):
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def _split_axes(mesh, call, q_sharding, heads_kv):
    """The mesh axes q's batch and heads are split over, as this call can keep them."""
    spec = tuple(q_sharding.spec) + (None,) * 4 if isinstance(q_sharding, NamedSharding) else (None,) * 4
    if call.config.layout == "thd":
        batch, heads = None, spec[1]
    else:
        axes = _config.AXES[call.config.layout]
        batch, heads = spec[axes[0]], spec[axes[1]]
    if heads is not None and heads_kv % math.prod(mesh.shape[n] for n in _names(heads)):
        heads = None
    # A modifier that reads the batch or head index as a number sees each shard's own indices:
    # that axis stays whole (its tensors are split with q, so indexing them is right either way).
    if _reads_index(call.config.score_mod, "b"):
        batch = None
    if _reads_index(call.config.score_mod, "h"):
        heads = None
    return batch, heads


def _reads_index(expression, name):
    """Whether a modifier's expression uses index `name` other than to index its tensors."""
    return re.search(rf"\b{name}\b", re.sub(r"t\d+\[[^\]]*\]", "", expression)) is not None


def _shardings(mesh, call, roles, batch, heads):
    """Each role's sharding: the mesh axes of q's batch and heads where the role has those, else
    nothing split."""
    split = {"BATCH": batch, "HEADS": heads}
    return [NamedSharding(mesh, PartitionSpec(*(split.get(a) for a in _axes(role, call, "BATCH", "HEADS", "HEADS"))))
            for role in roles]


def _shard_index(mesh, names):
    """This device's index among the shards over the mesh axes `names` (0 when there are none)."""
    index = jnp.uint32(0)
    for name in names:
        index = index * jnp.uint32(mesh.shape[name]) + jax.lax.axis_index(name).astype(jnp.uint32)
    return index


def partitioned(kernel_of, pass_, call, *, heads_q, heads_kv):
    """The `pass_` kernel, `kernel_of(pass_)(call, *arrays)`, as a custom_partitioning function whose
    per-device call sees the device's shard. The kernel is looked up when the call is traced or
    lowered, so tests can substitute reference kernels. (Not cached here: _kernels.pass_function,
    its one caller, caches what it makes of it.)"""
    inputs, outputs = call.inputs(pass_), call.outputs(pass_)
    single = len(outputs) == 1
    dropout, head_max_logit = call.config.dropout > 0.0, call.config.max_logit == "head"
    amaxes = len(FP8_OUTPUTS[pass_]) if call.fp8 else 0  # the last results

    @custom_partitioning
    def kernel(*arrays):
        return kernel_of(pass_)(call, *arrays)

    def choose(mesh, arg_shapes):
        batch, heads = _split_axes(mesh, call, arg_shapes[0].sharding, heads_kv)
        return (batch, heads, _shardings(mesh, call, inputs, batch, heads),
                _shardings(mesh, call, outputs, batch, heads))

    def partition(mesh, arg_shapes, result_shape):
        batch, heads, arg_shardings, result_shardings = choose(mesh, arg_shapes)
        split = _names(batch) + _names(heads)

        def per_shard(*shards):
            if dropout and split:  # rng: (seed, offset) as uint32 pairs; move the offset
                position = inputs.index("rng")
                rng = shards[position]
                rng = rng.at[2].add(_shard_index(mesh, split))
                shards = shards[:position] + (rng,) + shards[position + 1:]
            out = kernel_of(pass_)(call, *shards)
            if head_max_logit and _names(batch):  # each shard saw part of the batch
                out = out[:-1] + (jax.lax.pmax(out[-1], _names(batch)),)
            if amaxes and split:  # each shard measured its part of the tensor
                out = tuple(out[:-amaxes]) + tuple(jax.lax.pmax(a, split) for a in out[-amaxes:])
            return out
        return (mesh, per_shard, result_shardings[0] if single else tuple(result_shardings), tuple(arg_shardings))

    def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
        result_shardings = choose(mesh, arg_shapes)[3]
        return result_shardings[0] if single else tuple(result_shardings)

    grouping = "same" if heads_q == heads_kv else "single" if heads_kv == 1 else "grouped"
    rule = sharding_rule(call, inputs, outputs, grouping)
    kernel.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands, sharding_rule=rule,
                         need_replication_factors=_in_rule_order(rule, _REPLICATED),
                         **({"r": heads_q // heads_kv} if grouping == "grouped" else {}))
    return kernel
