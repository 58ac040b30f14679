"""fusedattn.torch's context parallelism: attention over sequences split across the ranks of a
torch.distributed process group, by ring (each key/value block passed to the next rank) or
all-gather, built on the core's forward and backward and their log-sum-exp, as fusedattn.jax's
(_jax_context_parallel.py has the algorithm's notes: load balancing, merged statistics, skipped
blocks, neutral statistics).

    o = fusedattn.torch.context_parallel_attention(q, k, v, group=group, causal=True)

q, k, v are this rank's parts of the sequence axis (bshd); with causal and load_balanced (the
default) rank r holds chunks r and 2N-1-r of every sequence (load_balance).

The algorithm is written against a small transport (what moves blocks between ranks), over a list
of the ranks this process runs: with a process group, its own rank, and NCCL's point-to-point
sends and collectives on a stream of their own, so that the next block travels while the current
one is computed; in tests, SimulatedRanks runs N ranks in one process, its transport in-process
copies. The block kernels are fusedattn's (CUDA); tests of the algorithm without a GPU give it
stand-ins (the `blocks` argument of run_forward / run_backward).

A learnable sink (softmax="sink") joins each row once, after the blocks; its gradient is summed
over the ranks. A sliding window (causal, or two-sided) runs each chunk of queries against each
chunk of keys as a window piece (_context_parallel.py): hidden, the diagonal, full, or a band the
score modifier _cp.BAND or _cp.BAND_BELOW masks. Packed sequences (thd, cu_seqlens) are split
sequence by sequence (_context_parallel.py says how); each piece is then one ragged call over every
sequence, under a window with each sequence's band (_cp.BANDS_PER_SEQUENCE). Not yet: dense
lengths; a run on several GPUs (issue 19).
"""
import contextlib

import torch

from .. import _context_parallel as _cp
from ..errors import invalid_argument

__all__ = ["context_parallel_attention", "load_balance", "unbalance", "SimulatedRanks", "Packed"]



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
    parts, order = x.chunk(2 * n, dim=dim), [None] * (2 * n)
    for position, c in enumerate(_cp.load_balanced_order(n)):
        order[c] = parts[position]
    return torch.cat(order, dim=dim)


# --- packed sequences (thd) ----------------------------------------------------------------------

class _Ops:
    """What _context_parallel's packed orders ask of torch."""
    where = staticmethod(torch.where)

    @staticmethod
    def searchsorted(a, v):
        return torch.searchsorted(a, v, right=True)


def _host_offsets(cu_seqlens, n, balanced):
    """A whole packed batch's offsets on the host (int64), checked as
    _context_parallel.check_packed_offsets says."""
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    _cp.check_packed_offsets(tuple(cu.shape), cu.flatten().tolist(), n, balanced, "rank")
    return cu


def _packed_order(cu_seqlens, n, balanced):
    """The whole batch's token indices in the order of the ranks' parts (load_balance)."""
    cu = _host_offsets(cu_seqlens, n, balanced)
    tokens = int(cu[-1])
    return _cp.packed_order(cu, n, balanced, tokens, torch.arange(tokens), _Ops)


class Packed:
    """A rank's part of a packed batch, as the pieces run it: its tokens reordered as every
    sequence's first chunk, then every sequence's second (halves); each half (the whole part,
    without load balancing) is a packed batch with offsets `cu` and longest sequence `max_seqlen`.
    The whole batch's offsets are read on the host, once per call."""

    def __init__(self, cu_seqlens, n, balanced, device):
        cu = _host_offsets(cu_seqlens, n, balanced)
        size, half = _cp.packed_sizes(cu, n, balanced)
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


# --- the block kernels ---------------------------------------------------------------------------

class FusedattnBlocks:
    """A block of keys against q through fusedattn's kernels: forward (O float32, statistics
    [b, h, s_q], or [tokens, h] packed) and backward with the O and statistics given, under a
    piece's mask (_context_parallel.pieces): none, the diagonal from the top-left (causal, or a
    window's bounds), or a band j - i >= offset (j - i <= offset) as the score modifier _cp.BAND
    (_cp.BAND_BELOW), whose offset is a runtime scalar (one plan for every offset). `packed` (a
    Packed): q, k, v are halves of packed parts (thd), one ragged call over their sequences."""

    def __init__(self, scale):
        self.scale = scale

    def _config(self, mask, packed=None):
        from .. import torch as adapter
        causal, window, score_mod = _cp.mask_options(mask)
        return adapter._config_text("thd" if packed else "bshd", "", causal, window, "top_left", False, False,
                                    "vanilla", 0.0, False, packed is not None, "", True, 0, score_mod)

    def _extras(self, mask, q, packed=None):
        from .. import torch as adapter
        scalars = torch.tensor([float(mask[1])], dtype=torch.float32, device=q.device) \
            if mask[0] in (_cp.BAND_PIECE, _cp.BAND_UPPER) else None
        bands = [x.to(q.device, torch.float32) for x in mask[1]] if mask[0] == _cp.SEQUENCE_BAND else (None, None)
        offsets = packed.cu if packed is not None else None
        return adapter._Extras(mod_scalars=scalars, mod_t0=bands[0], mod_t1=bands[1], cu_seqlens_q=offsets,
                               cu_seqlens_kv=offsets)

    def forward(self, q, k, v, mask, packed=None):
        from .. import torch as adapter
        longest = packed.max_seqlen if packed is not None else 0
        o, stats, _ = adapter._forward_body(q, k, v, None, None, self._extras(mask, q, packed),
                                            self._config(mask, packed), self.scale, longest, longest)
        return o.float(), stats

    def backward(self, q, k, v, o, stats, d_o, mask, packed=None):
        # q, k, v may be views (the core takes their strides); O, dO and the statistics are read as
        # the dense tensors the core allocates, so halves of them are copied.
        from .. import torch as adapter
        longest = packed.max_seqlen if packed is not None else 0
        d_q, d_k, d_v, _, _ = adapter._backward_body(d_o.contiguous(), q, k, v, o.contiguous(), stats.contiguous(), None,
                                                    None, self._extras(mask, q, packed), self._config(mask, packed),
                                                    self.scale, longest, longest)
        return d_q.float(), d_k.float(), d_v.float()


def _wide(x):
    """The dtype partial results and sums are kept in: float32, or x's where wider (the tests')."""
    return torch.promote_types(torch.float32, x.dtype)


def _zeros(x):
    return torch.zeros(x.shape, dtype=_wide(x), device=x.device)


def _neutral(q):
    """No keys seen: O 0, statistics -inf ([b, h, s] for bshd q, [tokens, h] for packed q)."""
    shape = q.shape[:2] if q.dim() == 3 else (q.shape[0], q.shape[2], q.shape[1])
    return _zeros(q), torch.full(shape, float("-inf"), dtype=_wide(q), device=q.device)


def _rows(stats):
    """Statistics in O's order of rows: [b, s, h] from [b, h, s]; packed ones ([tokens, h]) are."""
    return stats.transpose(1, 2) if stats.dim() == 3 else stats


def _merge(a, b):
    """Two partial results of the same rows over disjoint keys, as one. A row that saw no key of a
    part (statistic -inf, or not finite at all: a band piece's row left of its band) takes nothing
    from it, whatever its O holds there."""
    (o_a, lse_a), (o_b, lse_b) = a, b
    finite_a, finite_b = torch.isfinite(lse_a), torch.isfinite(lse_b)
    lse = torch.logaddexp(torch.where(finite_a, lse_a, float("-inf")), torch.where(finite_b, lse_b, float("-inf")))
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))

    def weighted(o, x, finite):
        w = _rows(torch.where(finite, torch.exp(torch.where(finite, x, 0) - safe), torch.zeros_like(x)))
        return torch.where(_rows(finite)[..., None], o * w[..., None], torch.zeros_like(o))
    return weighted(o_a, lse_a, finite_a) + weighted(o_b, lse_b, finite_b), lse


def _part(x, part, dim=1):
    start, stop = _cp.span(part, x.shape[dim])
    return x.narrow(dim, start, stop - start)


class _Kinds:
    """A block's pieces (_context_parallel.pieces, or window_pieces under a window's bounds)
    run through the block kernels; `packed` (a Packed) for halves of packed parts (thd), whose
    tokens are axis 0 of O and of the statistics (axes 1 and 2 for bshd)."""

    def __init__(self, blocks, causal, balanced, n, window=None, packed=None):
        self.blocks, self.causal, self.balanced, self.n, self.window = blocks, causal, balanced, n, window
        self.packed = packed
        self.axis, self.stats_axis = (0, 0) if packed is not None else (1, 2)
        self.extra = (packed,) if packed is not None else ()  # the block kernels' last argument, packed
        self._bands = {}  # packed windows: a chunk distance's mask, made once a call (its bounds on the device)

    def _pieces(self, rank, source, length):
        if self.window is not None and self.packed is not None:
            return self._packed_window_pieces(rank, source)
        if self.window is not None:
            return _cp.window_pieces(rank, source, self.n, self.balanced, length, self.window)
        pieces = _cp.pieces(_cp.kind_of(rank, source), self.causal, self.balanced)
        return _cp.packed_pieces(pieces) if self.packed is not None and self.balanced else pieces

    def _packed_window_pieces(self, rank, source):
        """Packed halves under a window: each chunk pair, the window itself where the chunks are
        the same, else each sequence's band (_context_parallel.sequence_band), none where the
        window misses every sequence's pair, a plain piece where it covers every one."""
        out = []
        for q_part, k_part in _cp.window_pairs(self.balanced):
            m = _cp.chunk_index(rank, q_part, self.n, self.balanced) - \
                _cp.chunk_index(source, k_part, self.n, self.balanced)
            mask = self._band(m)
            if mask is not None:
                out.append((q_part, k_part, mask))
        return out

    def _band(self, m):
        """The mask of packed halves m chunks apart under the window, or None where it misses every
        sequence's pair; each distance's is made once, its bounds copied to the device once."""
        if m in self._bands:
            return self._bands[m]
        mask = (_cp.DIAGONAL, self.window)
        if m != 0:
            low, high, hidden, full = _cp.sequence_band(m, self.packed.sizes, self.window)
            if bool(hidden.all()):
                mask = None
            elif bool(full.all()):
                mask = (_cp.FULL, 0)
            else:
                mask = (_cp.SEQUENCE_BAND, tuple(x.to(self.packed.cu.device, torch.float32) for x in (low, high)))
        self._bands[m] = mask
        return mask

    def forward(self, q, k, v, rank, source):
        """The block's partial result for all of q's rows (neutral where a piece leaves rows out)."""
        o, lse = _neutral(q)
        a, sa = self.axis, self.stats_axis
        for q_part, k_part, mask in self._pieces(rank, source, q.shape[a]):
            start, stop = _cp.span(q_part, q.shape[a])
            piece = self.blocks.forward(_part(q, q_part, a), _part(k, k_part, a), _part(v, k_part, a), mask,
                                        *self.extra)
            rows = _merge((_part(o, q_part, a), _part(lse, q_part, sa)), piece)
            o = torch.cat([o.narrow(a, 0, start), rows[0], o.narrow(a, stop, o.shape[a] - stop)], a)
            lse = torch.cat([lse.narrow(sa, 0, start), rows[1], lse.narrow(sa, stop, lse.shape[sa] - stop)], sa)
        return o, lse

    def backward(self, q, k, v, o, stats, d_o, rank, source):
        """(dQ of q's rows from this block, dK, dV of the block's keys), float32."""
        d_q, d_k, d_v = _zeros(q), _zeros(k), _zeros(v)
        a = self.axis
        for q_part, k_part, mask in self._pieces(rank, source, q.shape[a]):
            grads = self.blocks.backward(_part(q, q_part, a), _part(k, k_part, a), _part(v, k_part, a),
                                         _part(o, q_part, a), _part(stats, q_part, self.stats_axis),
                                         _part(d_o, q_part, a), mask, *self.extra)
            for total, grad, part in zip((d_q, d_k, d_v), grads, (q_part, k_part, k_part)):
                _part(total, part, a).add_(grad)
        return d_q, d_k, d_v


# --- the transports ------------------------------------------------------------------------------

class SimulatedRanks:
    """N ranks in one process: the transport of the algorithm's tests, with in-process copies."""

    def __init__(self, n):
        self.ranks, self.n = list(range(n)), n

    def shift(self, per_rank):
        """Each rank's tensors to the next rank: rank r gets rank r - 1's. Returns a handle whose
        wait() gives them (here at once)."""
        moved = [tuple(t.clone() for t in per_rank[(j - 1) % self.n]) for j in range(self.n)]
        return _Done(moved)

    def all_gather(self, per_rank):
        """Every rank's tensors, in rank order, for every rank."""
        return [[tuple(t.clone() for t in per_rank[s]) for s in range(self.n)] for _ in range(self.n)]

    def all_reduce_sum(self, per_rank):
        """Every rank's tensor summed, for every rank."""
        total = sum(per_rank[1:], per_rank[0])
        return [total.clone() for _ in range(self.n)]

    def reduce_scatter(self, per_rank):
        """per_rank[j][s]: rank j's contribution to rank s's tensors; each rank gets the sum of its own."""
        return [tuple(sum(per_rank[j][s][i] for j in range(self.n)) for i in range(len(per_rank[0][s])))
                for s in range(self.n)]


class _Done:
    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


class ProcessGroupTransport:
    """This process's rank of a torch.distributed group: point-to-point sends around the ring and
    collectives, issued on a stream of their own so that they overlap the attention."""

    def __init__(self, group):
        import torch.distributed as dist
        self.dist, self.group = dist, group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.ranks = [self.rank]
        # NCCL: a stream of their own; a CPU group (gloo, the tests') runs on the host.
        self.stream = torch.cuda.Stream() if dist.get_backend(group) == "nccl" else None

    def _peer(self, offset):
        return self.dist.get_global_rank(self.group, (self.rank + offset) % self.n)

    def shift(self, per_rank):
        (tensors,) = per_rank
        tensors = [t.contiguous() for t in tensors]
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            received = [torch.empty_like(t) for t in tensors]
            ops = [self.dist.P2POp(self.dist.isend, t, self._peer(1), self.group) for t in tensors] + \
                  [self.dist.P2POp(self.dist.irecv, t, self._peer(-1), self.group) for t in received]
            requests = self.dist.batch_isend_irecv(ops)
        if self.stream is not None:
            for t in tensors:
                t.record_stream(self.stream)
        return _Received(requests, received, self.stream)

    def all_gather(self, per_rank):
        (tensors,) = per_rank
        gathered = []
        for t in tensors:
            out = [torch.empty_like(t) for _ in range(self.n)]
            self.dist.all_gather(out, t.contiguous(), group=self.group)
            gathered.append(out)
        return [[tuple(g[s] for g in gathered) for s in range(self.n)]]

    def all_reduce_sum(self, per_rank):
        (mine,) = per_rank
        total = mine.clone()
        self.dist.all_reduce(total, group=self.group)
        return [total]

    def reduce_scatter(self, per_rank):
        (mine,) = per_rank
        out = []
        for i in range(len(mine[0])):
            parts = [mine[s][i].contiguous() for s in range(self.n)]
            if self.stream is None:  # gloo has no reduce_scatter: the whole sum, this rank's part of it
                whole = torch.stack(parts)
                self.dist.all_reduce(whole, group=self.group)
                out.append(whole[self.rank])
                continue
            result = torch.empty_like(parts[0])
            self.dist.reduce_scatter(result, parts, group=self.group)
            out.append(result)
        return [tuple(out)]


class _Received:
    def __init__(self, requests, tensors, stream):
        self.requests, self.tensors, self.stream = requests, tensors, stream

    def wait(self):
        for request in self.requests:
            request.wait()
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
        return [tuple(self.tensors)]



# --- the algorithm, over the ranks a process runs ------------------------------------------------

def _sink_partial(q, sink):
    """A learnable sink's share of every row: no value (O 0), the logit sink[h] (counted once, after
    the blocks, so that no block adds it again)."""
    o, stats = _neutral(q)
    return o, _rows(sink.to(stats.dtype).expand(_rows(stats).shape))


def _d_sink(o, stats, d_o, sink):
    """A sink's gradient from one rank's rows: -sum over rows of P_sink * rowsum(dO * O), P_sink =
    exp(sink - lse) (O = sum_j P_j v_j, and the sink moves every P_j by -P_sink)."""
    rows = (d_o.to(_wide(o)) * o.to(_wide(o))).sum(-1)  # O's rows: [b, s, h] or [tokens, h]
    return -(torch.exp(sink.to(stats.dtype) - _rows(stats)) * rows).flatten(0, -2).sum(0)


def run_forward(qs, ks, vs, transport, blocks, causal, balanced, scheme, sink=None, window=None, packed=None):
    """Per rank this process runs (transport.ranks): (O float32, statistics). `sink`: a learnable
    sink's logits [h_q] (softmax="sink"), or None; `window`: a sliding window's bounds (L, R), or None;
    `packed`: a Packed, the parts being packed halves (thd, Packed.halves)."""
    n, ranks = transport.n, transport.ranks
    kinds = _Kinds(blocks, causal, balanced, n, window, packed)
    outs = [_neutral(q) for q in qs]
    if scheme == "all_gather":
        gathered = transport.all_gather(list(zip(ks, vs)))
        for j, r in enumerate(ranks):
            for s in range(n):
                outs[j] = _merge(outs[j], kinds.forward(qs[j], *gathered[j][s], r, s))
    else:
        kv = list(zip(ks, vs))
        for t in range(n):  # at step t each rank holds the keys of rank r - t
            incoming = transport.shift(kv) if t < n - 1 else None  # travels while this step computes
            for j, r in enumerate(ranks):
                outs[j] = _merge(outs[j], kinds.forward(qs[j], *kv[j], r, (r - t) % n))
            if incoming is not None:
                kv = incoming.wait()
    if sink is not None:
        outs = [_merge(out, _sink_partial(q, sink)) for out, q in zip(outs, qs)]
    return outs


def run_backward(qs, ks, vs, os, stats, d_os, transport, blocks, causal, balanced, scheme, sink=None, window=None,
                 packed=None):
    """Per rank: (dQ, dK, dV) float32, each block's backward on the merged O and statistics (with a
    sink: which include it); and with a sink its gradient, summed over every rank, per rank."""
    grads = _block_gradients(qs, ks, vs, os, stats, d_os, transport, _Kinds(blocks, causal, balanced, transport.n,
                                                                              window, packed), scheme)
    if sink is None:
        return grads, None
    return grads, transport.all_reduce_sum([_d_sink(o, st, d_o, sink) for o, st, d_o in zip(os, stats, d_os)])


def _block_gradients(qs, ks, vs, os, stats, d_os, transport, kinds, scheme):
    n, ranks = transport.n, transport.ranks
    d_qs = [_zeros(q) for q in qs]
    if scheme == "all_gather":
        gathered = transport.all_gather(list(zip(ks, vs)))
        parts = []
        for j, r in enumerate(ranks):
            mine = []
            for s in range(n):
                d_q, d_k, d_v = kinds.backward(qs[j], *gathered[j][s], os[j], stats[j], d_os[j], r, s)
                d_qs[j] = d_qs[j] + d_q
                mine.append((d_k, d_v))
            parts.append(mine)
        d_kvs = transport.reduce_scatter(parts)
        return [(d_qs[j], *d_kvs[j]) for j in range(len(ranks))]
    kv = list(zip(ks, vs))
    d_kv = [(_zeros(k), _zeros(v)) for k, v in zip(ks, vs)]
    for t in range(n):
        incoming = transport.shift(kv) if t < n - 1 else None
        for j, r in enumerate(ranks):
            d_q, d_k, d_v = kinds.backward(qs[j], *kv[j], os[j], stats[j], d_os[j], r, (r - t) % n)
            d_qs[j] = d_qs[j] + d_q
            d_kv[j] = (d_kv[j][0] + d_k, d_kv[j][1] + d_v)
        # A block's dK, dV sums travel with it; after the last step one more hop brings them home.
        d_kv = transport.shift(d_kv).wait()
        if incoming is not None:
            kv = incoming.wait()
    return [(d_qs[j], *d_kv[j]) for j in range(len(ranks))]


class _ContextParallel(torch.autograd.Function):
    """One rank's call, the transport a process group's; packed parts (thd) are reordered into the
    pieces' halves here and back."""

    @staticmethod
    def forward(ctx, q, k, v, sink, transport, blocks, causal, balanced, scheme, window, packed):
        order = packed.halves if packed is not None else (lambda x: x)
        q, k, v = order(q), order(k), order(v)
        ((o, stats),) = run_forward([q], [k], [v], transport, blocks, causal, balanced, scheme, sink, window, packed)
        o = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, stats, sink)
        ctx.settings = (transport, blocks, causal, balanced, scheme)
        ctx.window, ctx.packed = window, packed
        return packed.restore(o) if packed is not None else o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, stats, sink = ctx.saved_tensors
        packed = ctx.packed
        d_o = packed.halves(d_o) if packed is not None else d_o
        ((d_q, d_k, d_v),), d_sinks = run_backward([q], [k], [v], [o], [stats], [d_o.to(o.dtype)], *ctx.settings,
                                                   sink=sink, window=ctx.window, packed=packed)
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
    import torch.distributed as dist
    window = _cp.window_bounds(window, causal)
    causal = causal or (window is not None and window[1] == 0)
    packed_call = cu_seqlens is not None
    _cp.check_arguments(q.shape, k.shape, causal, load_balanced, scheme, "rank", packed_call)
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else float(scale)
    group = group if group is not None else dist.group.WORLD
    balanced = bool(causal and load_balanced)
    packed = None
    if packed_call:
        packed = Packed(cu_seqlens, dist.get_world_size(group), balanced, q.device)
        if q.shape[0] != packed.tokens:
            raise invalid_argument("q.shape", tuple(q.shape), f"[{packed.tokens}, h, d]: a rank's part of the "
                                   f"{packed.tokens * dist.get_world_size(group)} tokens cu_seqlens gives")
    transport = ProcessGroupTransport(group)
    return _ContextParallel.apply(q, k, v, sink, transport, blocks if blocks is not None else FusedattnBlocks(scale),
                                  bool(causal), balanced, scheme, window, packed)
