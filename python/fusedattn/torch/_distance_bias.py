"""A bias that reads the query and key positions only through their distance kv - q (T5's bucketed
relative positions, a relative-position table by clamped distance): evaluated once per distance,
s_q + s_kv - 1 values a batch entry and head, then laid out over the [s_q, s_kv] square as the
Toeplitz matrix it is, in one copy. Gathered at every (q, kv) pair instead, T5's bias took 0.9 ms
at 2 x 2k h16 on the H200 (the gather at a fraction of memory speed, then a pass to convert), more
than the attention it feeds. Its gradient sums each diagonal back into its distance (autograd's
backward of unfold)."""
import torch

from .. import _score_mod_bias


def applies(text, sizes):
    """Whether the bias of expression `text` over sizes (b, h, s_q, s_kv) is evaluated by distance."""
    return sizes[2] > 1 and sizes[3] > 1 and _score_mod_bias.by_distance(text)


def grid_sizes(sizes):
    """(b, h, 1, s_q + s_kv - 1): one query, every distance as a key."""
    return sizes[0], sizes[1], 1, sizes[2] + sizes[3] - 1


def key_grid(sizes, device):
    """The keys of the distance grid, [1, 1, 1, s_q + s_kv - 1]: with the query at 0, kv - q runs
    from -(s_q - 1) to s_kv - 1."""
    return torch.arange(1 - sizes[2], sizes[3], device=device).view(1, 1, 1, -1)


def toeplitz(values, s_q, s_kv, dtype):
    """values [..., 1, s_q + s_kv - 1] by distance (kv - q = d at index d + s_q - 1) as a contiguous
    [..., s_q, s_kv] in `dtype`, element (i, j) values[..., j - i + s_q - 1]; differentiable, each
    distance's gradient the sum of its diagonal in the values' own precision (a bfloat16 sum of
    thousands of terms would lose most of their digits)."""
    return _Toeplitz.apply(values, s_q, s_kv, dtype)


def _laid_out(values, s_kv):
    # Window r of the distances (a view) is row s_q - 1 - r; a view cannot reverse the rows (no
    # negative strides), so the windows are written out and their rows reversed: two passes that
    # read and write in memory order.
    return values.squeeze(-2).unfold(-1, s_kv, 1).contiguous().flip(-2)


class _Toeplitz(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, s_q, s_kv, dtype):
        ctx.shape, ctx.dtype, ctx.s_kv = values.shape, values.dtype, s_kv
        return _laid_out(values.to(dtype), s_kv)

    @staticmethod
    def backward(ctx, grad):
        windows = grad.to(ctx.dtype).flip(-2)  # rows back in window order
        sums = torch.ops.aten.unfold_backward(windows, list(ctx.shape[:-2]) + [ctx.shape[-1]], windows.dim() - 2,
                                              ctx.s_kv, 1)
        return sums.unsqueeze(-2), None, None, None
