"""Padded batches in fusedattn's terms, from transformers' 2D padding mask: which keys and queries
are real, the order that moves a row's real tokens to its front (so that runtime lengths, "the first
n tokens", say which they are), and the additive bias of a decode step. Pure tensor functions with
fixed shapes and no host synchronization, so compiled code traces them as they are."""
import torch


def validity(attention_mask, batch_size, q_length, kv_length, q_offset, kv_offset, device):
    """(keys, queries): bool [b, kv_length] and [b, q_length], True where a token is real. Key j sits
    at position kv_offset + j and query i at q_offset + i, as transformers' masks place them (a
    static cache gives q_offset as a tensor). A key is real where the 2D mask keeps its position
    (positions past the mask's end are padding, as transformers pads it) and it is not past the
    last query (a static cache's slots not yet written); a query is real where its own position is."""
    kv_pos = torch.arange(kv_length, device=device) + kv_offset
    q_pos = torch.arange(q_length, device=device) + q_offset
    keys = (kv_pos <= q_pos[-1]).expand(batch_size, kv_length)
    if attention_mask is None:
        return keys, torch.ones(batch_size, q_length, dtype=torch.bool, device=device)
    missing = kv_offset + kv_length - attention_mask.shape[-1]
    mask = torch.nn.functional.pad(attention_mask, (0, missing)) if missing > 0 else attention_mask
    keys = keys & mask[:, kv_offset:kv_offset + kv_length]
    return keys, mask.index_select(1, q_pos)


class Compaction:
    """A row's real tokens moved to its front, in their order: `order[b, r]` is the position of the
    r-th real token of row b (then the padding, in order), `restore` its inverse (each position's
    place after the move), `lengths` int32 [b] the real tokens a row has."""

    def __init__(self, valid):
        valid_int = valid.to(torch.int32)
        self.lengths = valid_int.sum(1, dtype=torch.int32)
        real_rank = valid_int.cumsum(1) - 1                        # among the real tokens
        pad_rank = (1 - valid_int).cumsum(1) - 1 + self.lengths[:, None]  # the padding after them
        self.restore = torch.where(valid, real_rank, pad_rank).to(torch.int64)
        arange = torch.arange(valid.shape[1], device=valid.device).expand_as(self.restore)
        self.order = torch.empty_like(self.restore).scatter_(1, self.restore, arange)

    def in_place(self):
        """A device bool: every row's real tokens are already at its front (right padding)."""
        return (self.restore == torch.arange(self.restore.shape[1], device=self.restore.device)).all()


def take_rows(x, index):
    """x [b, s, ...] with its sequence positions taken in `index` [b, s] order."""
    return torch.take_along_dim(x, index.view(*index.shape, *([1] * (x.dim() - 2))), dim=1)


def decode_bias(keys, q_position, kv_offset, *, causal, window, dtype):
    """The additive bias [b, 1, 1, s_kv] of one query at `q_position` (an int or a 0-d tensor): 0 for
    the keys it sees (real, and within the causal mask and the window of `window` keys when given),
    dtype's lowest value for the rest, as transformers' eager masks write it. A decode step's whole
    mask in one row of keys: no causal flag or window is needed beside it."""
    kv_pos = torch.arange(keys.shape[1], device=keys.device) + kv_offset
    keep = keys
    if causal:
        keep = keep & (kv_pos <= q_position)
    if window is not None:
        keep = keep & (kv_pos > q_position - window)
    zero = torch.zeros((), dtype=dtype, device=keys.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)[:, None, None, :]
