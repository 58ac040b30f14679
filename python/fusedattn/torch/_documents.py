"""FlexAttention's document masks as packed sequences. A mask that keeps exactly the keys of each
query's own document, doc[q_idx] == doc[kv_idx] (with q_idx >= kv_idx beside it for causal ones),
over document ids that form runs, is the block diagonal of those runs: as conditions on the scores
cuDNN would compute the whole square, while the runs as packed sequences (thd with cu_seqlens)
compute only the blocks. flex_attention takes this road in eager calls; compiled code, where the
runs are data the graph cannot size, keeps the conditions."""
import collections
import dataclasses

import torch

from . import _score_mod

# The traced texts of the document masks (each document's keys; and not after the query).
_DOCUMENT_MASKS = {"select(eq(t0[q],t1[kv]),score,-inf)": False,
                   "select(and(eq(t0[q],t1[kv]),ge(q,kv)),score,-inf)": True,
                   "select(and(ge(q,kv),eq(t0[q],t1[kv])),score,-inf)": True}


@dataclasses.dataclass(frozen=True)
class Documents:
    """The packed sequences of a document mask: cu_seqlens (int32 [batch * documents + 1]) over the
    batch's tokens, entry after entry, the longest document, and whether the mask is causal."""
    cu_seqlens: torch.Tensor
    longest: int
    causal: bool


def documents(mask_mod, score_mod, query, key):
    """The Documents of `mask_mod` for these [b, h, s, d] tensors, or None where the mask is not a
    document mask over runs (it then runs as conditions)."""
    if mask_mod is None or torch.compiler.is_compiling() or query.device.type == "meta":
        return None
    batch, _, length, _ = query.shape
    if key.shape[2] != length:
        return None
    traced = _score_mod.traced(_score_mod.masked(None, mask_mod)).traced
    causal = _DOCUMENT_MASKS.get(traced.text)
    if causal is None or traced.bias is not None or traced.tensors[0] is not traced.tensors[1]:
        return None
    ids = traced.tensors[0]
    if ids.dim() != 1 or ids.shape[0] != length or ids.is_floating_point():
        return None
    if _score_mod.reads_indices(score_mod):  # packed sequences number their own tokens
        return None
    return _cached_runs(ids, query.device, batch, length, causal)


# The runs of the id tensors seen last: a model calls flex_attention in every layer with the same
# mask, and finding the runs reads them to the host (two synchronizations). An entry holds its ids
# tensor, so it matches only that tensor (not a new one at a freed address), and its version, so an
# in-place change of the ids finds the runs again.
_RUNS = collections.OrderedDict()
_RUNS_KEPT = 16


def _cached_runs(ids, device, batch, length, causal):
    key = (id(ids), ids._version, device, batch, length, causal)
    entry = _RUNS.get(key)
    if entry is not None and entry[0] is ids:
        _RUNS.move_to_end(key)
        return entry[1]
    runs = _runs(ids.to(device), batch, length, causal)
    _RUNS[key] = (ids, runs)
    if len(_RUNS) > _RUNS_KEPT:
        _RUNS.popitem(last=False)
    return runs


def _runs(ids, batch, length, causal):
    """Each run of equal ids one sequence, in every batch entry; None where an id comes back after
    another (its tokens would not be one sequence). Reads the runs' count to the host."""
    values, counts = torch.unique_consecutive(ids, return_counts=True)
    if torch.unique(values).numel() != values.numel():
        return None
    ends = counts.cumsum(0)
    starts = torch.arange(batch, device=ids.device, dtype=ends.dtype).unsqueeze(1) * length
    cu = torch.cat([ends.new_zeros(1), (starts + ends.unsqueeze(0)).flatten()]).to(torch.int32)
    return Documents(cu, int(counts.max()), causal)


def pack(x):
    """[b, h, s, d] as packed tokens [b * s, h, d], token after token. At b = 1 a view of x (each
    token's heads s * d apart: the core's ragged tensors take any strides, and their gradients land
    in x's own order); at b > 1 a copy, since a row's tokens do not follow the last row's by one
    stride."""
    return x.transpose(1, 2).reshape(x.shape[0] * x.shape[2], x.shape[1], x.shape[3])


def unpack(o, batch, length):
    """Packed O [b * s, h, d] (or statistics [b * s, h]) back in [b, h, s, ...] order (a view)."""
    return o.view(batch, length, *o.shape[1:]).transpose(1, 2)
