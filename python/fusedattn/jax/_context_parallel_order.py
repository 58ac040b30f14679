"""Where context parallelism wants each token: load_balance and unbalance (chunks r and 2N-1-r of
every sequence on device r), and the orders of packed sequences (thd), the shared formulas of
fusedattn/_context_parallel.py traced with jnp."""
import jax
import jax.numpy as jnp
import numpy as np

from .. import _context_parallel as _cp


def load_balance(x, n, axis=1, *, cu_seqlens=None, balanced=True):
    """x with its `axis` (the sequence) reordered so that its n equal parts, as shard_map splits
    them, hold chunks (r, 2n-1-r) of 2n: part r's causal work is then the same for every r. A
    packed batch (thd: x [tokens, h, d], axis 0, with its cu_seqlens): so that part r holds those
    chunks of every sequence, sequence after sequence; with balanced=False chunk r of n of each."""
    if cu_seqlens is not None:
        return jnp.take(x, _packed_order(cu_seqlens, n, balanced=balanced, tokens=x.shape[0]), axis=0)
    chunks = jnp.split(x, 2 * n, axis=axis)
    return jnp.concatenate([chunks[c] for c in _cp.load_balanced_order(n)], axis=axis)


def unbalance(x, n, axis=1, *, cu_seqlens=None, balanced=True):
    """The inverse of load_balance."""
    if cu_seqlens is not None:
        return jnp.zeros_like(x).at[_packed_order(cu_seqlens, n, balanced=balanced, tokens=x.shape[0])].set(x)
    return jnp.concatenate(_cp.in_sequence_order(jnp.split(x, 2 * n, axis=axis), n), axis=axis)


class JnpOps:
    """What _context_parallel's packed orders ask of jnp."""
    where = staticmethod(jnp.where)

    @staticmethod
    def searchsorted(a, v):
        return jnp.searchsorted(a, v, side="right")


def checked_offsets(cu_seqlens, n, *, balanced):
    """The whole batch's offsets as int32, checked (_context_parallel.check_packed_offsets): their
    values where they are known, their shape where they are traced."""
    known = None if isinstance(cu_seqlens, jax.core.Tracer) else np.asarray(cu_seqlens).astype(np.int64)
    _cp.check_packed_offsets(tuple(jnp.shape(cu_seqlens)), None if known is None else known.flatten().tolist(), n,
                             balanced=balanced, holder="device")
    return jnp.asarray(cu_seqlens, jnp.int32)


def _packed_order(cu_seqlens, n, *, balanced, tokens):
    return _cp.packed_order(checked_offsets(cu_seqlens, n, balanced=balanced), n, balanced=balanced, tokens=tokens,
                            positions=jnp.arange(tokens), ops=JnpOps)
