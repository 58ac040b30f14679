"""Packed batches (several documents in a row) as packed sequences (thd): their offsets, from the
cu_seq_lens_q / cu_seq_lens_k keywords that transformers' flash-attention path takes (a collator's
DataCollatorWithFlattening(return_flash_attn_kwargs=True), continuous batching), or from position
ids that restart, where transformers found them so."""
import weakref

import torch

from ..errors import invalid_argument


class Packed:
    """Where a call's sequences are in its flattened tokens: int32 cumulative offsets [n + 1] of the
    queries and keys, and the longest of each (a bound is enough: it only sizes the plan)."""

    def __init__(self, cu_q, cu_kv, max_q, max_kv):
        self.cu_q, self.cu_kv, self.max_q, self.max_kv = cu_q, cu_kv, max_q, max_kv
        self.same = cu_q is cu_kv  # queries and keys the same tokens: the top-left diagonal is theirs


def _longest(value, bound):
    """A longest length as a number: an int as it is, a tensor read once outside compiled code, and
    inside it (or when absent) the tokens the call holds, a bound that needs no synchronization."""
    if isinstance(value, torch.Tensor):
        return bound if torch.compiler.is_compiling() else int(value)
    return bound if value is None else int(value)


def from_keywords(kwargs, q_tokens, kv_tokens):
    """The Packed of transformers' flash keywords, or None without them."""
    cu_q, cu_kv = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and cu_kv is None:
        return None
    if cu_q is None or cu_kv is None:
        raise invalid_argument("cu_seq_lens_q" if cu_q is None else "cu_seq_lens_k", None,
                               "both cu_seq_lens_q and cu_seq_lens_k for packed sequences")
    same = cu_q is cu_kv
    cu_q = cu_q.to(torch.int32)
    cu_kv = cu_q if same else cu_kv.to(torch.int32)
    return Packed(cu_q, cu_kv, _longest(kwargs.get("max_length_q"), q_tokens),
                  _longest(kwargs.get("max_length_k"), kv_tokens))


# The last position ids read and what they gave: every layer of one forward gets the same tensor,
# so a forward reads them once.
_last = [None, None, None]  # weak reference to the tensor, its version counter, the Packed


def from_position_ids(position_ids, batch, length):
    """The Packed of a batch whose position ids restart within rows (a new document wherever a
    position is not the previous one plus one, as transformers finds them), each row's start a
    document too; outside compiled code only (it reads the ids: one synchronization a forward)."""
    if _last[0] is not None and _last[0]() is position_ids and _last[1] == position_ids._version:
        return _last[2]
    ids = position_ids.expand(batch, length)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1] + 1
    first = starts.flatten().nonzero().flatten().to(torch.int32)
    cu = torch.cat([first, torch.full((1,), batch * length, dtype=torch.int32, device=first.device)])
    longest = int(cu.diff().max())
    packed = Packed(cu, cu, longest, longest)
    _last[:] = [weakref.ref(position_ids), position_ids._version, packed]
    return packed
