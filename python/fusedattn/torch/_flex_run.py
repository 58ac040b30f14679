"""flex_attention's schedules (fusedattn/_tile_schedule.py) run: each piece one call over views of
the bhsd q, k, v (slices of the sequence axes), its score function moved to the view
(_flex_views.Shifted) where it reads positions; the mask as conditions only in CONDITIONS pieces.

Prefix-LM's schedule (its first rows see the whole prefix, the rest are causal) runs as the causal
square, the kernels' fastest mask, with the prefix's square run again over the first rows, whose O
and statistics replace the square's; both start at position 0, so a score_mod needs no move. In the
backward the square's rows of the prefix get dO 0 and give nothing (dS = P (dP - D) is 0 where dO
is), whatever O and statistics those rows then hold. Two roads:
  - eager calls whose score_mod has no learned terms: _PrefixOverCausal, both passes on
    fusedattn.torch's C++ path where it takes them (python/bindings/torch_prefix.h), else each call
    a FusedattnPiece; the prefix's O written over the square's rows and its gradients added to
    theirs in place;
  - compiled code, and learned terms (whose gradients only autograd carries): two attention() calls,
    the prefix's slice_scattered over the square (_prefix_by_calls).

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
from ..errors import NotSupportedError
from .._tile_cover import BAND_PIECE, CONDITIONS_PIECE, FULL_PIECE
from .._tile_schedule import Piece
from . import _score_mod
from ._flex_pieces import FusedattnPiece
from ._flex_views import shifted


def run(schedule, query, key, value, *, score_mod, mask_mod, scale, return_lse, attention):
    """O (and with return_lse the log-sum-exp, float32 [b, h, s_q]) of the schedule's pieces;
    `attention` is fusedattn.torch.attention, which the first way calls."""
    prefix = _prefix_length(schedule, query, key)
    if prefix and (torch.compiler.is_compiling() or _score_mod.learned(score_mod)):
        return _prefix_by_calls(prefix, query, key, value, score_mod, scale, return_lse, attention)
    if prefix:
        whole, first = (FusedattnPiece(piece, score_mod, _scale(query, scale))
                        for piece in _prefix_pieces(prefix, query.shape[2]))
        o, lse = _PrefixOverCausal.apply(query, key, value, whole, first, prefix)
        return (o, lse) if return_lse else o
    functions = [_function(piece, score_mod, mask_mod) for piece in schedule.pieces]
    if schedule.rows_apart and not schedule.empty_rows_inside:
        return _by_rows(schedule, functions, query, key, value, scale, return_lse, attention)
    pieces = [(piece, FusedattnPiece(piece, fn, _scale(query, scale))) for piece, fn in zip(schedule.pieces, functions)]
    o, lse = _Merged.apply(query, key, value, pieces)
    return (o, lse) if return_lse else o


def _scale(query, scale):
    """flex_attention's scale as a number: 1/sqrt(d) where it is None."""
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)


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


def _prefix_by_calls(prefix, query, key, value, score_mod, scale, return_lse, attention):
    """The module docstring's second prefix road: the causal square and the prefix's square as
    attention() calls, the prefix's rows slice_scattered over the square's (a copy of the contiguous
    O; a cat of the square's strided rows ran at a quarter of a copy's speed)."""
    call = dict(layout="bhsd", scale=scale, score_mod=score_mod, return_stats=return_lse)
    whole = attention(query, key, value, causal=True, **call)
    first = attention(query[:, :, :prefix], key[:, :, :prefix], value[:, :, :prefix], **call)
    if not return_lse:
        return whole.slice_scatter(first, 2, 0, prefix)
    return tuple(a.slice_scatter(b, 2, 0, prefix) for a, b in zip(whole, first))


def _prefix_pieces(prefix, s):
    """The causal square and the prefix's square, both from position 0."""
    return (Piece((0, s), (0, s), BAND_PIECE, window=(-1, 0)), Piece((0, prefix), (0, prefix), FULL_PIECE))


class _PrefixOverCausal(torch.autograd.Function):
    """The module docstring's first prefix road: `whole` (the causal square) and `first` (the
    prefix's square), FusedattnPieces; `prefix`: P. Where the C++ path takes both, both passes run
    there whole (python/bindings/torch_prefix.h: the same calls, the prefix's reading and writing the
    whole tensors' rows in place); else each call through its piece, composed here."""

    @staticmethod
    def forward(ctx, query, key, value, whole, first, prefix):
        ctx.fast = _fast_prefix(whole, first, query, key, value)
        out = NotImplemented if ctx.fast is None else ctx.fast[0].prefix_forward(
            query, key, value, prefix, ctx.fast[1], ctx.fast[2], whole.scale, ctx.fast[3])
        if out is not NotImplemented:
            o, lse, lse_first = out
            ctx.save_for_backward(query, key, value, o, lse, lse_first)
            ctx.scale, ctx.prefix = whole.scale, prefix
            ctx.mark_non_differentiable(lse)
            return o, lse
        ctx.fast = None
        o, lse = whole.forward(query, key, value)
        o_first, lse_first = first.forward(query[:, :, :prefix], key[:, :, :prefix], value[:, :, :prefix])
        o[:, :, :prefix] = o_first
        lse[:, :, :prefix] = lse_first
        ctx.save_for_backward(query, key, value, o, lse)
        ctx.pieces, ctx.prefix = (whole, first), prefix
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, d_o, _d_lse):
        if ctx.fast is not None:
            fast, whole_id, first_id, scalars = ctx.fast
            grads = fast.prefix_backward(d_o, *ctx.saved_tensors, ctx.prefix, whole_id, first_id, ctx.scale, scalars)
            if grads is NotImplemented:  # the forward's pieces never ran: there is no other road now
                raise NotSupportedError("flex_attention's prefix-LM backward: its forward ran on fusedattn.torch's "
                                        "C++ path, which its backward cannot take (a tensor subclass, a dispatch "
                                        "mode or forward-mode AD appeared between the two passes)")
            return grads + (None, None, None)
        query, key, value, o, lse = ctx.saved_tensors
        (whole, first), n = ctx.pieces, ctx.prefix
        d_o_rest = d_o.clone(memory_format=torch.contiguous_format)  # autograd's dO stays as it is
        d_o_rest[:, :, :n] = 0  # the square's rows of the prefix: the prefix call's
        d_q, d_k, d_v = whole.backward(d_o_rest, query, key, value, o, lse)
        views = (query[:, :, :n], key[:, :, :n], value[:, :, :n])
        f_q, f_k, f_v = first.backward(d_o[:, :, :n], *views, o[:, :, :n], lse[:, :, :n])
        d_q[:, :, :n] = f_q  # the square's are 0 there: their dO is
        d_k[:, :, :n] += f_k
        d_v[:, :, :n] += f_v
        return d_q, d_k, d_v, None, None, None


def _fast_prefix(whole, first, query, key, value):
    """(the C++ path's module, the two pieces' config ids, the score function's scalars) where that
    path may take both pieces, else None."""
    whole_call, first_call = whole.fast_call(query, key, value), first.fast_call(query, key, value)
    if whole_call is None or first_call is None:
        return None
    return whole_call[0], whole_call[1], first_call[1], whole_call[2]


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
