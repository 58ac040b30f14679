"""Context parallelism's block calls and partial results: the core's forward (O and statistics) and
backward of one device's queries against a block of keys under a piece's mask, and partial
results over disjoint keys merged by the one log-sum-exp merge (fusedattn/_merge.py)."""
import functools

import jax
import jax.numpy as jnp

from .. import _config
from .. import _context_parallel as _cp
from .. import _merge
from ._calls import BACKWARD, FORWARD, traced_call
from ._kernels import kernel


class BlockKernels:
    """One device's block calls, of a piece's mask (the kinds of _context_parallel.window_piece):
    none, the diagonal from the top-left (causal, or a window's bounds), or a band j - i >= offset
    (j - i <= offset) as the score modifier _cp.BAND (_cp.BAND_BELOW), whose offset (traced) is its
    runtime scalar. `packed`: (offsets of each half's sequences, the longest one's tokens) for halves
    of packed parts (thd), else None."""

    def __init__(self, scale):
        self.scale = scale

    def _kernel(self, pass_, mask, q, k, v, packed):
        # The kernel itself (_kernels.KERNELS: the CUDA call, or what a test put there): inside
        # shard_map every array is already this device's, so attention()'s partitioning has no part.
        # Returns it with the band's scalar operand, or a packed call's offsets, bound after the arrays.
        causal, window, score_mod = _cp.mask_options(mask)
        config = _config.config("thd" if packed else "bshd", causal=causal, window=window, stats=True,
                                score_mod=score_mod, padding=packed is not None)
        longest = (packed[1], packed[1]) if packed else (0, 0)
        call, _ = traced_call(config, q, k, v, scale=self.scale, max_seqlen=longest,
                              sequences=packed[0].shape[0] - 1 if packed else 0)
        run = functools.partial(kernel(pass_), call)
        if packed and mask[0] == _cp.SEQUENCE_BAND:
            low, high = mask[1]
            return lambda *arrays: run(*arrays, packed[0], packed[0], low, high)
        if packed:
            return lambda *arrays: run(*arrays, packed[0], packed[0])
        if mask[0] not in (_cp.BAND_PIECE, _cp.BAND_UPPER):
            return run
        scalars = jnp.reshape(jnp.asarray(mask[1], jnp.float32), (1,))
        return lambda *arrays: run(*arrays, scalars)

    def forward(self, q, k, v, *, mask, packed=None):
        """(O in float32, statistics [b, h, s_q], or [tokens, h] packed)."""
        o, stats = self._kernel(FORWARD, mask, q, k, v, packed)(q, k, v)
        return o.astype(jnp.float32), stats

    def backward(self, q, k, v, o, stats, d_o, *, mask, packed=None):
        """(dQ, dK, dV) in float32."""
        d_q, d_k, d_v = self._kernel(BACKWARD, mask, q, k, v, packed)(q, k, v, o, stats, d_o)
        return d_q.astype(jnp.float32), d_k.astype(jnp.float32), d_v.astype(jnp.float32)


def zeros_like(x):
    """Float32 zeros of x's shape, made from x so that inside shard_map they vary over the mesh axis
    as x does (lax.switch wants its branches' results typed alike)."""
    return x.astype(jnp.float32) * 0.0


def neutral(q):
    """No keys seen: O 0, statistics -inf ([b, h, s] for bshd q, [tokens, h] for packed q)."""
    return zeros_like(q), _merge.rows(zeros_like(q[..., 0])) - jnp.inf


def merge(a, b):
    """The one merge (fusedattn/_merge.py) in jax.numpy."""
    return _merge.merge(a, b, jnp)


def part_of(x, part, axis=1):
    """`part` of x's `axis`; all of it is x itself (no slice for XLA to see)."""
    if part == _cp.ALL:
        return x
    start, stop = _cp.span(part, x.shape[axis])
    return jax.lax.slice_in_dim(x, start, stop, axis=axis)


def put(x, part, axis, value, *, add=False):
    """x with `part` of its `axis` set to (or, add: increased by) value; all of it is value itself
    (or x + value), not an update of the whole array."""
    if part == _cp.ALL:
        return x + value if add else value
    start, stop = _cp.span(part, x.shape[axis])
    index = (slice(None),) * axis + (slice(start, stop),)
    return x.at[index].add(value) if add else x.at[index].set(value)
