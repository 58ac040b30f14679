"""fusedattn's mask form for transformers' mask interface: what a model's mask means, kept small.
transformers builds each mask once per forward (one per layer type) and hands it to every layer;
for fusedattn it becomes a FusedMask instead of a [b, 1, s_q, s_kv] tensor:

  plain    no padding, keys ending at the last query: the causal mask (bottom-right with a
           cache) and the window are the kernel's own;
  padded   runtime lengths, after moving each row's real tokens to its front when they are not
           there already (left padding), queries and keys alike;
  decode   one query: its whole row of keys as an additive bias [b, 1, 1, s_kv];
  custom   the model added conditions of its own (or_mask_function / and_mask_function, such as
           image tokens that see each other): not expressible without a dense mask.

Outside compiled code one synchronization per mask tells plain and right padding from the rest
(transformers' own masks read the padding mask the same way); compiled code (and meta tensors) take
the general form, whose shapes are fixed. Each FusedMask keeps the arguments it was made from (`recipe`), so the
fallback can build transformers' own mask from them."""
import torch

from ._padding import Compaction, decode_bias, validity


class FusedMask:
    """One of transformers' masks in fusedattn's terms (the module docstring's kinds). `causal` says
    whether transformers made a causal mask or a bidirectional one; `window` the keys a sliding layer's query sees (None for full
    attention); `packed_hint` marks a batch that transformers found packed by its position ids
    (outside compiled code); `top_left` that queries and keys are the same tokens (no cache), where
    the top-left and bottom-right diagonals coincide."""

    # generate() makes a static cache's masks ahead of the model's forward and passes them in as its
    # attention_mask; transformers' mask functions take anything of more than two dims as a mask
    # already made and hand it on (fusedattn_mask returns it as it is).
    ndim = 4

    def __init__(self, kind, *, causal, window, recipe, top_left=False, packed_hint=False, seq_len_q=None,
                 seq_len_kv=None, order_q=None, restore_q=None, order_kv=None, bias=None):
        self.kind, self.causal, self.window, self.recipe = kind, causal, window, recipe
        self.top_left, self.packed_hint = top_left, packed_hint
        self.seq_len_q, self.seq_len_kv, self.bias = seq_len_q, seq_len_kv, bias
        self.order_q, self.restore_q, self.order_kv = order_q, restore_q, order_kv

    def __repr__(self):
        return f"FusedMask({self.kind}, causal={self.causal}, window={self.window})"


def fusedattn_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
                   local_size=None, allow_is_causal_skip=True, use_vmap=False, config=None, dtype=torch.float32,
                   device="cpu", **kwargs):
    """transformers' mask interface (AttentionMaskInterface): the arguments its create_*_mask
    functions pass to every mask function, answered with a FusedMask."""
    if isinstance(attention_mask, FusedMask):  # made ahead (generate() with a static cache)
        return attention_mask
    recipe = dict(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                  kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                  local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, use_vmap=use_vmap, config=config,
                  dtype=dtype, device=device, **kwargs)
    # transformers' bidirectional masks (encoders, decoders with config.is_causal off) are the ones
    # that pass allow_is_bidirectional_skip; its causal and sliding ones never do.
    causal = "allow_is_bidirectional_skip" not in kwargs
    common = dict(causal=causal, window=local_size, recipe=recipe)
    if use_vmap:  # transformers sets it exactly when a model adds or_/and_mask_function conditions
        return FusedMask("custom", **common)
    static = isinstance(q_offset, int) and isinstance(kv_offset, int)
    fresh = static and q_offset == 0 and kv_offset == 0 and q_length == kv_length  # no cache: the same tokens
    ends_together = static and kv_offset + kv_length == q_offset + q_length
    # Values are read outside compiled code only, and never from meta tensors (they have none).
    eager = not torch.compiler.is_compiling() and torch.device(device).type != "meta"
    if attention_mask is None and ends_together:
        # Without a padding mask transformers finds packed sequences by their position ids, and then
        # (only then, outside compiled code) asks for the mask without its causal shortcut.
        return FusedMask("plain", top_left=fresh, packed_hint=eager and fresh and not allow_is_causal_skip, **common)
    keys, queries = validity(attention_mask, batch_size, q_length, kv_length, q_offset, kv_offset, device)
    if q_length == 1 and not (eager and ends_together and bool(keys.all())):
        bias = decode_bias(keys, q_offset, kv_offset, causal=causal, window=local_size, dtype=dtype)
        return FusedMask("decode", bias=bias, **common)
    compact_q, compact_kv = Compaction(queries), Compaction(keys)
    moved_q = moved_kv = True
    if eager:  # one synchronization: plain after all, right padding, or tokens to move
        all_real, q_in_place, kv_in_place = torch.stack(
            [keys.all() & queries.all(), compact_q.in_place(), compact_kv.in_place()]).tolist()
        if all_real and ends_together:
            return FusedMask("plain", top_left=fresh, **common)
        moved_q, moved_kv = not q_in_place, not kv_in_place
    return FusedMask("padded", top_left=fresh, seq_len_q=compact_q.lengths, seq_len_kv=compact_kv.lengths,
                     order_q=compact_q.order if moved_q else None, restore_q=compact_q.restore if moved_q else None,
                     order_kv=compact_kv.order if moved_kv else None, **common)
