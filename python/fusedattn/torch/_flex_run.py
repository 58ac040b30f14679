"""flex_attention's schedules (fusedattn/_tile_schedule.py) run: each piece one call over views of
the bhsd q, k, v (slices of the sequence axes), its score function moved to the view
(_flex_views.Shifted) where it reads positions; the mask as conditions only in CONDITIONS pieces.

Prefix-LM's schedule (its first rows see the whole prefix, the rest are causal) runs as two
attention() calls from position 0: the causal square, the kernels' fastest mask, and the prefix's
square, whose rows replace the square's (_prefix_over_causal). Both start at position 0, so a
score_mod needs no move, and autograd through each call is the exact backward: the square's rows of
the prefix get dO 0 and give nothing (dS = P (dP - D) is 0 where dO is), learned terms of a
score_mod included. Plain calls take fusedattn.torch's C++ path, so neither pass runs Python.

Otherwise, two ways, one schedule:
  - pieces over rows apart, each row seeing a key in its piece (prefix-LM: the prefix's rows
    unmasked, the others causal bottom-right): each piece is fusedattn.torch.attention over its
    rows, concatenated. A row's whole softmax is its one piece's, so autograd through each call is
    the exact backward, and compiled code runs it as it runs attention();
  - pieces sharing rows (or conditions, which may leave a row no key): each piece through
    fusedattn's forward (_flex_pieces.py), merged in float32 by the one log-sum-exp merge
    (fusedattn/_merge.py); the backward runs each piece's backward with the merged O and statistics
    of its whole rows, so each piece's softmax and dS are exact, summing dQ over a row's pieces and
    dK, dV over a key's.
Rows that see no key come out as FlexAttention gives them: O 0 and log-sum-exp -inf (and no
gradient). In the backward their statistic is +inf, which makes every probability of them 0."""
import math

import torch

from .. import _merge
from .._tile_cover import BAND_PIECE, CONDITIONS_PIECE, FULL_PIECE
from . import _score_mod
from ._flex_pieces import FusedattnPiece
from ._flex_views import shifted


def run(schedule, query, key, value, *, score_mod, mask_mod, scale, return_lse, attention):
    """O (and with return_lse the log-sum-exp, float32 [b, h, s_q]) of the schedule's pieces;
    `attention` is fusedattn.torch.attention, which the first way calls."""
    prefix = _prefix_length(schedule, query, key)
    if prefix:
        return _prefix_over_causal(prefix, query, key, value, score_mod, scale, return_lse, attention)
    functions = [_function(piece, score_mod, mask_mod) for piece in schedule.pieces]
    if schedule.rows_apart and not schedule.empty_rows_inside:
        return _by_rows(schedule, functions, query, key, value, scale, return_lse, attention)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    pieces = [(piece, FusedattnPiece(piece, fn, scale)) for piece, fn in zip(schedule.pieces, functions)]
    o, lse = _Merged.apply(query, key, value, pieces)
    return (o, lse) if return_lse else o


def _prefix_length(schedule, query, key):
    """P where `schedule` is prefix-LM's over a square of s rows and keys: rows [0, P) x keys
    [0, P) unmasked, then rows [P, s) causal bottom-right over every key; else 0."""
    s = query.shape[2]
    if len(schedule.pieces) != 2 or key.shape[2] != s:
        return 0
    first, rest = schedule.pieces
    p = first.rows[1]
    return p if (first.mask == FULL_PIECE and first.rows == first.keys == (0, p) and rest.rows == (p, s)
                 and rest.keys == (0, s) and rest.mask == BAND_PIECE and rest.window == (-1, 0)
                 and rest.align == "bottom_right") else 0


def _prefix_over_causal(prefix, query, key, value, score_mod, scale, return_lse, attention):
    """The module docstring's prefix road: the causal square, its first `prefix` rows replaced by
    the prefix's square."""
    call = dict(layout="bhsd", scale=scale, score_mod=score_mod, return_stats=return_lse)
    whole = attention(query, key, value, causal=True, **call)
    first = attention(query[:, :, :prefix], key[:, :, :prefix], value[:, :, :prefix], **call)
    # slice_scatter, not cat of the square's rows: a copy of the whole contiguous O (cat of a strided
    # view ran at a quarter of the copy's speed, 49 us at 2x2k h16 on the H100), and its backward
    # gives the square dO with the prefix's rows 0 and the prefix's call their rows.
    if not return_lse:
        return whole.slice_scatter(first, 2, 0, prefix)
    return tuple(a.slice_scatter(b, 2, 0, prefix) for a, b in zip(whole, first))


def _function(piece, score_mod, mask_mod):
    """The score function a piece calls: the score_mod (the mask_mod under it as conditions in a
    CONDITIONS piece), moved to the piece's view where it reads positions (a mask always does)."""
    if piece.mask == CONDITIONS_PIECE:
        return shifted(_score_mod.masked(score_mod, mask_mod), piece.rows, piece.keys)
    if score_mod is None or not _score_mod.reads_indices(score_mod):
        return score_mod
    return shifted(score_mod, piece.rows, piece.keys)


def _views(piece, query, key, value):
    (r0, r1), (c0, c1) = piece.rows, piece.keys
    return query[:, :, r0:r1], key[:, :, c0:c1], value[:, :, c0:c1]


def _by_rows(schedule, functions, query, key, value, scale, return_lse, attention):
    """The first way: one attention() call a piece, in row order, rows of no piece O 0 and -inf."""
    b, h, s_q, _ = query.shape
    outs, stats, at = [], [], 0
    for piece, fn in zip(schedule.pieces, functions):
        for part in ((at, piece.rows[0]),) if piece.rows[0] > at else ():
            outs.append(query.new_zeros(b, h, part[1] - part[0], value.shape[-1]))
            stats.append(query.new_full((b, h, part[1] - part[0]), float("-inf"), dtype=torch.float32))
        out = attention(*_views(piece, query, key, value), layout="bhsd", window=piece.window, align=piece.align,
                        scale=scale, score_mod=fn, return_stats=return_lse)
        outs.append(out[0] if return_lse else out)
        stats.append(out[1] if return_lse else None)
        at = piece.rows[1]
    if at < s_q:
        outs.append(query.new_zeros(b, h, s_q - at, value.shape[-1]))
        stats.append(query.new_full((b, h, s_q - at), float("-inf"), dtype=torch.float32))
    o = outs[0] if len(outs) == 1 else torch.cat(outs, 2)
    if not return_lse:
        return o
    return o, stats[0] if len(stats) == 1 else torch.cat(stats, 2)


class _Merged(torch.autograd.Function):
    """The second way (the module's docstring). `pieces`: (Piece, its kernels: FusedattnPiece)."""

    @staticmethod
    def forward(ctx, query, key, value, pieces):
        b, h, s_q, _ = query.shape
        o = torch.zeros(b, h, s_q, value.shape[-1], dtype=_wide(query), device=query.device)
        lse = torch.full((b, h, s_q), float("-inf"), dtype=_wide(query), device=query.device)
        for piece, kernels in pieces:
            r0, r1 = piece.rows
            part_o, part_lse = kernels.forward(*_views(piece, query, key, value))
            if piece.merges:  # the merge takes O's rows as [b, s, h, d]
                merged_o, merged_lse = _merge.merge((o[:, :, r0:r1].transpose(1, 2), lse[:, :, r0:r1]),
                                                    (part_o.transpose(1, 2), part_lse), torch)
                part_o, part_lse = merged_o.transpose(1, 2), merged_lse
            o[:, :, r0:r1] = part_o
            lse[:, :, r0:r1] = part_lse
        seen = torch.isfinite(lse)  # a piece that gave a row no key may leave NaN or -inf there
        o = torch.where(seen.unsqueeze(-1), o, 0.0).to(query.dtype)
        lse = torch.where(seen, lse, float("-inf"))
        ctx.save_for_backward(query, key, value, o, lse)  # the statistics as wide as they were merged
        ctx.pieces = pieces
        lse = lse.float()
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, d_o, _d_lse):
        query, key, value, o, lse = ctx.saved_tensors
        stats = torch.where(torch.isfinite(lse), lse, float("inf"))  # no key: every probability exp(-inf) = 0
        grads = [torch.zeros(x.shape, dtype=_wide(x), device=x.device) for x in (query, key, value)]
        for piece, kernels in ctx.pieces:
            (r0, r1), (c0, c1) = piece.rows, piece.keys
            d_q, d_k, d_v = kernels.backward(d_o[:, :, r0:r1], *_views(piece, query, key, value), o[:, :, r0:r1],
                                             stats[:, :, r0:r1])
            grads[0][:, :, r0:r1] += d_q
            grads[1][:, :, c0:c1] += d_k
            grads[2][:, :, c0:c1] += d_v
        return tuple(g.to(x.dtype) for g, x in zip(grads, (query, key, value))) + (None,)


def _wide(x):
    """The dtype pieces are merged and gradients summed in: float32, or x's where wider (the tests')."""
    return torch.promote_types(torch.float32, x.dtype)
