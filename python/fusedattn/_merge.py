"""The one log-sum-exp merge of partial attention results, framework-free: every composite call that
computes a row's attention in pieces over disjoint keys (context parallelism's blocks, a learnable
sink's extra column) joins them here, through the array namespace it is given (torch or
jax.numpy), so both adapters share one formula and one treatment of empty rows.

A partial result is (O, statistics): O's rows [b, s, h, d] (or packed [tokens, h, d]) and the
log-sum-exp of the scaled scores each row saw, [b, h, s] (or [tokens, h]). With L = logaddexp(L_a,
L_b), the merged O is O_a exp(L_a - L) + O_b exp(L_b - L): each piece's softmax was normalized by
its own sum, and these weights renormalize it to the whole row's. The split decode and the decode
kernel do the same reduction over their chunks inside one CUDA kernel (src/exec/decode_merge.cu),
where a framework call per chunk would cost more than the attention itself."""


def rows(stats):
    """Statistics in O's order of rows: [b, s, h] from [b, h, s]; packed ones ([tokens, h]) are."""
    return stats.swapaxes(1, 2) if stats.ndim == 3 else stats


def merge(a, b, xp):
    """Two partial results of the same rows over disjoint keys, as one, in the namespace `xp`. A row
    that saw no key of a part (statistic -inf, or not finite at all: a band piece's row left of its
    band, whose O the kernel may leave as anything) takes nothing from it, so the merge never
    propagates a NaN from a part the row did not see."""
    (o_a, lse_a), (o_b, lse_b) = a, b
    finite_a, finite_b = xp.isfinite(lse_a), xp.isfinite(lse_b)
    lse = xp.logaddexp(xp.where(finite_a, lse_a, float("-inf")), xp.where(finite_b, lse_b, float("-inf")))
    safe = xp.where(xp.isfinite(lse), lse, 0.0)  # a row empty in both parts stays -inf with O = 0

    def weighted(o, lse_part, finite):
        weight = rows(xp.where(finite, xp.exp(xp.where(finite, lse_part, 0.0) - safe), 0.0))
        return xp.where(rows(finite)[..., None], o * weight[..., None], 0.0)
    return weighted(o_a, lse_a, finite_a) + weighted(o_b, lse_b, finite_b), lse
