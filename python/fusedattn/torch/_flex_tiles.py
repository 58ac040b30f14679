"""flex_attention's masks as tiles, and the schedule that runs them (fusedattn/_tile_schedule.py).

Where the tiles come from:
  - a traced prefix-LM mask (fusedattn/_mask_structure.py) gives them by its own cut, exactly and
    with no look at the BlockMask, so compiled code takes this road too;
  - otherwise, in eager calls, the BlockMask's blocks: kv_indices (PARTIAL) and full_kv_indices
    (FULL), the rest EMPTY, at its BLOCK_SIZE. A tile whose kind differs between batch entries or
    heads is PARTIAL (the mask_mod decides it for each). Each PARTIAL tile the same for every batch
    entry and head is then looked at: mask_mod evaluated at every pair of it (vmapped, as
    FlexAttention evaluates it) says whether it is in fact EMPTY or FULL, or a band lo <= j - i <= hi,
    which cuDNN's band mask runs exactly. That look reads the tiles to the host once: the tiles are
    kept per BlockMask (while its tensors are not written to) and per mask_mod, and the schedule per
    tiles and problem size, so a training loop pays it once per BlockMask.
Without a mask_mod beside the blocks (FlexAttention's noop_mask), a PARTIAL block keeps every pair."""
import math
import weakref

import torch

from .. import _tile_schedule
from .._tile_cover import EMPTY, FULL, PARTIAL, Tiles, prefix_tiles
from ..errors import NotSupportedError
from . import _score_mod

_EVALUATED = 1 << 24  # pairs of mask_mod evaluated at a time (bools, times batch entries and heads)
_kept = weakref.WeakKeyDictionary()  # BlockMask -> (its key, Tiles)


def plan(mask_mod, block_mask, score_mod, query, key):
    """The Schedule flex_attention runs, or None: one attention() call (no mask, a band mask that it
    makes its window, a square in compiled code, a prefix-LM too small to split)."""
    s_q, s_kv = query.shape[2], key.shape[2]
    sizes = (query.shape[0] * query.shape[1], query.shape[3])
    if torch.compiler.is_compiling():  # only the prefix's tiles, which need no look at the BlockMask
        structure = _score_mod.mask_structure(mask_mod) if mask_mod is not None else None
        if structure is None or structure[0] != "prefix":
            return None
        return _prefix_schedule(structure[1], s_q, s_kv, *sizes)
    traced = mask_mod is not None and traceable(mask_mod)
    structure = _score_mod.mask_structure(mask_mod) if traced else None
    if structure is not None:
        return None if structure[0] == "band" else _prefix_schedule(structure[1], s_q, s_kv, *sizes)
    if block_mask is None or block_mask.kv_num_blocks.device.type == "meta":
        return None
    tiles = block_tiles(block_mask, mask_mod, s_q, s_kv)
    schedule = _tile_schedule.schedule(tiles, _tile_schedule.Work(*sizes), conditions=traced)
    if schedule is None:  # PARTIAL tiles that only conditions could run, from a mask_mod that cannot be traced
        _score_mod.mask_structure(mask_mod)  # raises the tracer's reason
    return _run_as_pieces(schedule, score_mod, traced)


@torch.compiler.assume_constant_result  # compiled code gets the schedule as a constant
def _prefix_schedule(length, s_q, s_kv, heads, head_dim):
    """The schedule of prefix-LM's tiles, or None for one call (its pieces share no row, and every
    row sees a key: they run as attention() calls, learned terms of a score_mod included)."""
    schedule = _tile_schedule.schedule(prefix_tiles(length, s_q, s_kv), _tile_schedule.Work(heads, head_dim))
    return None if schedule.square else schedule


def traceable(mask_mod):
    """Whether the tracer follows mask_mod (then it can run as conditions); None has nothing to
    follow, and compiled code assumes it does (the tracer's reason is raised there when not)."""
    if mask_mod is None or torch.compiler.is_compiling():
        return True
    try:
        _score_mod.mask_structure(mask_mod)
    except NotSupportedError:
        return False
    return True


def _run_as_pieces(schedule, score_mod, square):
    """The schedule, or None for one attention() call with the mask as conditions over the square
    (where `square`, a traced mask_mod, allows it): where the merged pieces' backward cannot carry a
    score_mod's learned terms (a bias with a gradient). The cost model's square stays one piece of
    the merged way, which gives rows that see no key FlexAttention's O 0 and log-sum-exp -inf,
    forward and backward."""
    merged = not schedule.rows_apart or schedule.empty_rows_inside
    if not merged or not _score_mod.learned(score_mod):
        return schedule
    if square:
        return None
    raise NotSupportedError("flex_attention: a score_mod with learned terms (a tensor that requires grad) beside a "
                            "BlockMask whose pieces share rows and that has no mask_mod fusedattn can trace (the "
                            "pieces' backward carries no gradient of such terms; one call over the square would "
                            "need the mask as conditions)")


def block_tiles(block_mask, mask_mod, s_q, s_kv):
    """The Tiles of a BlockMask over s_q x s_kv (the module's docstring), kept per BlockMask."""
    tensors = (block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
               block_mask.full_kv_indices)
    key = (mask_mod, s_q, s_kv, tuple(_written(t) for t in tensors))
    kept = _kept.get(block_mask)
    if kept is not None and kept[0] == key:
        return kept[1]
    block = block_mask.BLOCK_SIZE
    b_q, b_kv = (block, block) if isinstance(block, int) else block
    rows = tuple(min(i * b_q, s_q) for i in range(math.ceil(s_q / b_q))) + (s_q,)
    cols = tuple(min(j * b_kv, s_kv) for j in range(math.ceil(s_kv / b_kv))) + (s_kv,)
    partial, full = (_listed(num, indices, len(rows) - 1, len(cols) - 1) for num, indices in
                     ((tensors[0], tensors[1]), (tensors[2], tensors[3])))
    if mask_mod is None:  # noop_mask: a partial block keeps every pair
        partial, full = torch.zeros_like(partial), full | partial
    kinds = torch.where(full, FULL, torch.where(partial, PARTIAL, EMPTY))  # [B, H, rows, cols]
    same = (kinds == kinds[:1, :1]).all(0).all(0)
    if mask_mod is None and not bool(same.all()):
        raise NotSupportedError("flex_attention: a BlockMask whose blocks differ between batch entries or heads "
                                "needs its mask_mod (fusedattn runs every batch entry and head alike, and only a "
                                "mask_mod's conditions tell them apart)")
    kinds = torch.where(same, kinds[0, 0], PARTIAL)
    bands = [[None] * (len(cols) - 1) for _ in range(len(rows) - 1)]
    if mask_mod is not None:
        _look(mask_mod, block_mask, kinds, bands, rows, cols, torch.nonzero(same & (kinds == PARTIAL)).tolist())
    tiles = Tiles(rows, cols, tuple(tuple(row) for row in kinds.tolist()), tuple(tuple(row) for row in bands))
    _kept[block_mask] = (key, tiles)
    return tiles


def _written(tensor):
    """How often a tensor was written to in place (None for none, or an inference tensor, which
    counts nothing and cannot be written to outside inference mode)."""
    if tensor is None or tensor.is_inference():
        return None
    return tensor._version


def _listed(num, indices, n_rows, n_cols):
    """[B, H, n_rows, n_cols] bools on the host: the blocks each row of blocks lists (none where
    the BlockMask has no such list)."""
    if num is None:
        return torch.zeros(1, 1, n_rows, n_cols, dtype=torch.bool)
    num, indices = num[..., :n_rows].cpu(), indices[..., :n_rows, :].cpu().long()
    listed = torch.arange(indices.shape[-1]) < num.unsqueeze(-1)
    out = torch.zeros(*indices.shape[:-1], n_cols + 1, dtype=torch.bool)  # the last column takes the unlisted
    out.scatter_(-1, torch.where(listed, indices.clamp(0, n_cols), n_cols), True)
    return out[..., :n_cols]


def _look(mask_mod, block_mask, kinds, bands, rows, cols, tiles):
    """Evaluates mask_mod over the PARTIAL `tiles` ([i, j] each) the same for every batch entry and
    head, and writes what they are into `kinds` (EMPTY or FULL after all, or PARTIAL) and `bands`."""
    device = block_mask.kv_num_blocks.device
    batch, heads = block_mask.kv_num_blocks.shape[:2]
    b_q, b_kv = max(b - a for a, b in zip(rows, rows[1:])), max(b - a for a, b in zip(cols, cols[1:]))
    step = max(1, _EVALUATED // (batch * heads * b_q * b_kv))
    for at in range(0, len(tiles), step):
        chunk = torch.tensor(tiles[at:at + step], dtype=torch.long)
        r0, c0 = torch.tensor(rows)[chunk[:, 0]], torch.tensor(cols)[chunk[:, 1]]
        r1, c1 = torch.tensor(rows)[chunk[:, 0] + 1], torch.tensor(cols)[chunk[:, 1] + 1]
        i, j = r0[:, None] + torch.arange(b_q), c0[:, None] + torch.arange(b_kv)  # [tiles, b_q], [tiles, b_kv]
        inside = (i < r1[:, None])[:, :, None] & (j < c1[:, None])[:, None, :]
        kept = _evaluate(mask_mod, batch, heads, i.clamp(max=rows[-1] - 1), j.clamp(max=cols[-1] - 1), device)
        uniform = ((kept == kept[:1, :1]) | ~inside).flatten(3).all(-1).all(0).all(0)
        kept = kept[0, 0] & inside
        d = j[:, None, :] - i[:, :, None]
        lo = torch.where(kept, d, d.max() + 1).flatten(1).amin(1)
        hi = torch.where(kept, d, d.min() - 1).flatten(1).amax(1)
        banded = (((d >= lo[:, None, None]) & (d <= hi[:, None, None])) == kept) | ~inside
        every = (kept | ~inside).flatten(1).all(1)
        for n, (ti, tj) in enumerate(tiles[at:at + step]):
            if not bool(uniform[n]):
                continue
            if not bool(kept[n].any()) or bool(every[n]):
                kinds[ti, tj] = FULL if bool(every[n]) else EMPTY
            elif bool(banded[n].all()):
                bands[ti][tj] = (int(lo[n]), int(hi[n]))


def _evaluate(mask_mod, batch, heads, i, j, device):
    """mask_mod at every (b, h, i[t, x], j[t, y]): bools [batch, heads, tiles, x, y] on the host."""
    fn = mask_mod
    for dims in ((None, None, None, 0), (None, None, 0, None), (None, None, 0, 0), (None, 0, None, None),
                 (0, None, None, None)):
        fn = torch.vmap(fn, in_dims=dims)
    b, h = torch.arange(batch, device=device), torch.arange(heads, device=device)
    return fn(b, h, i.to(device), j.to(device)).to("cpu", torch.bool)
