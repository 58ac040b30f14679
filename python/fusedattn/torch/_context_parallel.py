"""fusedattn.torch's context parallelism: attention over sequences split across the ranks of a
torch.distributed process group, by ring (each key/value block passed to the next rank) or
all-gather, built on the core's forward and backward and their log-sum-exp, as fusedattn.jax's
(fusedattn/jax/_context_parallel.py has the algorithm's notes: load balancing, merged statistics,
skipped blocks, neutral statistics).

    o = fusedattn.torch.context_parallel_attention(q, k, v, group=group, causal=True)

q, k, v are this rank's parts of the sequence axis (bshd); with causal and load_balanced (the
default) rank r holds chunks r and 2N-1-r of every sequence (load_balance).

This module lays the parts out (load_balance, Packed) and makes the call differentiable; the
schedule (_cp_schedule.py) runs the pieces of every block through the block kernels
(_cp_blocks.py: fusedattn's, CUDA; tests of the algorithm without a GPU give it stand-ins) and
merges them, and a transport (_cp_transports.py) moves the blocks: a process group's here, the
simulated ranks of one process in tests.

A learnable sink (softmax="sink") joins each row once, after the blocks; its gradient is summed
over the ranks. A sliding window (causal, or two-sided) runs each chunk of queries against each
chunk of keys as a window piece (fusedattn/_context_parallel.py): hidden, the diagonal, full, or a
band the score modifier _cp.BAND or _cp.BAND_BELOW masks. Packed sequences (thd, cu_seqlens) are
split sequence by sequence (fusedattn/_context_parallel.py says how); each piece is then one ragged
call over every sequence, under a window with each sequence's band (_cp.BANDS_PER_SEQUENCE). Not
yet: dense lengths; a run on several GPUs (issue 19).
"""
import torch
import torch.distributed as dist

from .. import _context_parallel as _cp
from ..errors import invalid_argument
from ._cp_blocks import FusedattnBlocks
from ._cp_schedule import run_backward, run_forward
from ._cp_transports import ProcessGroupTransport


def load_balance(x, n, dim=1, *, cu_seqlens=None, balanced=True):
    """x with its sequence `dim` reordered so that its n equal parts hold chunks (r, 2n-1-r) of 2n.
    A packed batch (thd: x [tokens, h, d], dim 0, with its cu_seqlens): so that part r holds those
    chunks of every sequence, sequence after sequence; with balanced=False chunk r of n of each."""
    if cu_seqlens is not None:
        return x.index_select(0, _packed_order(cu_seqlens, n, balanced).to(x.device))
    chunks = x.chunk(2 * n, dim=dim)
    return torch.cat([chunks[c] for c in _cp.load_balanced_order(n)], dim=dim)


def unbalance(x, n, dim=1, *, cu_seqlens=None, balanced=True):
    """The inverse of load_balance."""
    if cu_seqlens is not None:
        return torch.empty_like(x).index_copy_(0, _packed_order(cu_seqlens, n, balanced).to(x.device), x)
    return torch.cat(_cp.in_sequence_order(x.chunk(2 * n, dim=dim), n), dim=dim)


# --- packed sequences (thd) ----------------------------------------------------------------------

class _Ops:
    """What _cp's packed orders ask of torch."""
    where = staticmethod(torch.where)

    @staticmethod
    def searchsorted(a, v):
        return torch.searchsorted(a, v, right=True)


def _host_offsets(cu_seqlens, n, balanced):
    """A whole packed batch's offsets on the host (int64), checked as _cp.check_packed_offsets
    says."""
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    _cp.check_packed_offsets(tuple(cu.shape), cu.flatten().tolist(), n, balanced=balanced, holder="rank")
    return cu


def _packed_order(cu_seqlens, n, balanced):
    """The whole batch's token indices in the order of the ranks' parts (load_balance)."""
    cu = _host_offsets(cu_seqlens, n, balanced)
    tokens = int(cu[-1])
    return _cp.packed_order(cu, n, balanced=balanced, tokens=tokens, positions=torch.arange(tokens), ops=_Ops)


class Packed:
    """A rank's part of a packed batch, as the pieces run it: its tokens reordered as every
    sequence's first chunk, then every sequence's second (halves); each half (the whole part,
    without load balancing) is a packed batch with offsets `cu` and longest sequence `max_seqlen`.
    The whole batch's offsets are read on the host, once per call."""

    def __init__(self, cu_seqlens, n, balanced, device):
        cu = _host_offsets(cu_seqlens, n, balanced)
        size, half = _cp.packed_sizes(cu, n, balanced=balanced)
        self.tokens = int(cu[-1]) // n
        self.sizes = size  # each sequence's chunk length, on the host (a window's pieces read it)
        self.cu = half.to(device, torch.int32)
        self.max_seqlen = max(int(size.max()), 1) if len(size) else 1
        self.order = _cp.halves_order(cu, n, self.tokens, torch.arange(self.tokens), _Ops).to(device) \
            if balanced else None

    def halves(self, x):
        """x (a rank's part, [tokens, ...]) in the pieces' order."""
        return x if self.order is None else x.index_select(0, self.order)

    def restore(self, x):
        """The inverse of halves."""
        return x if self.order is None else torch.empty_like(x).index_copy_(0, self.order, x)


# --- the call ------------------------------------------------------------------------------------

class _ContextParallel(torch.autograd.Function):
    """One rank's call, the transport a process group's; packed parts (thd) are reordered into the
    pieces' halves here and back."""

    @staticmethod
    def forward(ctx, q, k, v, sink, transport, blocks, causal, balanced, scheme, window, packed):
        order = packed.halves if packed is not None else (lambda x: x)
        q, k, v = order(q), order(k), order(v)
        schedule = dict(causal=causal, balanced=balanced, scheme=scheme, window=window, packed=packed)
        ((o, stats),) = run_forward([q], [k], [v], transport, blocks, sink=sink, **schedule)
        o = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, stats, sink)
        ctx.transport, ctx.blocks, ctx.schedule = transport, blocks, schedule
        return packed.restore(o) if packed is not None else o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, stats, sink = ctx.saved_tensors
        packed = ctx.schedule["packed"]
        d_o = packed.halves(d_o) if packed is not None else d_o
        ((d_q, d_k, d_v),), d_sinks = run_backward([q], [k], [v], [o], [stats], [d_o.to(o.dtype)], ctx.transport,
                                                   ctx.blocks, sink=sink, **ctx.schedule)
        d_sink = None if d_sinks is None else d_sinks[0].to(sink.dtype)
        grads = [g.to(x.dtype) for g, x in zip((d_q, d_k, d_v), (q, k, v))]
        if packed is not None:
            grads = [packed.restore(g) for g in grads]
        return (*grads, d_sink) + (None,) * 7


def context_parallel_attention(q, k, v, *, group=None, causal=False, window=(-1, -1), scheme="ring",
                               load_balanced=True, scale=None, sink=None, cu_seqlens=None, blocks=None):
    """Attention of this rank's queries against the keys of every rank of `group` (default: the
    world), bshd parts of the sequence axis, GQA allowed; differentiable in q, k, v. scheme: "ring"
    or "all_gather". Causal with load_balanced: rank r holds chunks r and 2N-1-r (load_balance).
    window=(W, 0) (or (W, -1) with causal): a causal sliding window of W keys (the diagonal's among
    them, as in attention()), in positions of the whole sequence; with causal=False, (L, R): L keys
    up to the diagonal and R after it (-1: no bound), the ranks holding contiguous chunks. sink: a
    learnable sink's logits, float32 [h_q], the same on every rank (softmax="sink"); its gradient
    comes back summed over the group's ranks.
    cu_seqlens: a packed batch (thd): q, k, v [tokens, h, d] are this rank's part (load_balance
    with cu_seqlens: chunks r and 2N-1-r of every sequence, or chunk r without load balancing),
    cu_seqlens the whole batch's int32 [b + 1] offsets, the same on every rank, each length a
    multiple of 2N (N). It is read on the host: pass it there to spare a device read.
    `blocks` replaces fusedattn's block kernels (tests of the algorithm on CPU groups)."""
    packed_call = cu_seqlens is not None
    window, causal, balanced, scale = _cp.call_options(q.shape, k.shape, window=window, causal=causal,
                                                       load_balanced=load_balanced, scheme=scheme, holder="rank",
                                                       packed=packed_call, scale=scale)
    group = group if group is not None else dist.group.WORLD
    packed = None
    if packed_call:
        packed = Packed(cu_seqlens, dist.get_world_size(group), balanced, q.device)
        if q.shape[0] != packed.tokens:
            raise invalid_argument("q.shape", tuple(q.shape), f"[{packed.tokens}, h, d]: a rank's part of the "
                                   f"{packed.tokens * dist.get_world_size(group)} tokens cu_seqlens gives")
    transport = ProcessGroupTransport(group)
    return _ContextParallel.apply(q, k, v, sink, transport, blocks if blocks is not None else FusedattnBlocks(scale),
                                  bool(causal), balanced, scheme, window, packed)
