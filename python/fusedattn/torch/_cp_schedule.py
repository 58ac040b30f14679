"""Context parallelism's schedule in PyTorch, over the ranks one process runs (transport.ranks):
which pieces of each block of keys run (fusedattn/_context_parallel.py), each through the block
kernels it is given (_cp_blocks.FusedattnBlocks, or the tests' stand-ins), merged exactly through
the log-sum-exp, by ring (each block passed to the next rank while the current one is computed) or
all-gather. The transport (_cp_transports.py) moves the blocks; the same code runs a process
group's one rank or N simulated ranks in one process. A learnable sink joins each row once, after
the blocks, and its gradient is summed over the ranks."""
import torch

from .. import _context_parallel as _cp
from .. import _merge

# --- partial results: O and statistics of some of the keys, merged through the log-sum-exp ------------

def _wide(x):
    """The dtype partial results and sums are kept in: float32, or x's where wider (the tests')."""
    return torch.promote_types(torch.float32, x.dtype)


def _zeros(x):
    return torch.zeros(x.shape, dtype=_wide(x), device=x.device)


def _neutral(q):
    """No keys seen: O 0, statistics -inf ([b, h, s] for bshd q, [tokens, h] for packed q)."""
    shape = q.shape[:2] if q.dim() == 3 else (q.shape[0], q.shape[2], q.shape[1])
    return _zeros(q), torch.full(shape, float("-inf"), dtype=_wide(q), device=q.device)


def _merged(a, b):
    """The one merge (fusedattn/_merge.py) in PyTorch."""
    return _merge.merge(a, b, torch)


def _part(x, part, dim=1):
    start, stop = _cp.span(part, x.shape[dim])
    return x.narrow(dim, start, stop - start)


# --- a block's pieces -------------------------------------------------------------------------------

class _Kinds:
    """A block's pieces (_cp.pieces, or _cp.window_pieces under a window's bounds) run through the
    block kernels; `packed` (a Packed) for halves of packed parts (thd), whose tokens are axis 0 of
    O and of the statistics (axes 1 and 2 for bshd)."""

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
            return _cp.window_pieces(rank, source, self.n, balanced=self.balanced, length=length,
                                    bounds=self.window)
        pieces = _cp.pieces(_cp.kind_of(rank, source), causal=self.causal, balanced=self.balanced)
        return _cp.packed_pieces(pieces) if self.packed is not None and self.balanced else pieces

    def _packed_window_pieces(self, rank, source):
        """Packed halves under a window: each chunk pair, the window itself where the chunks are
        the same, else each sequence's band (_cp.sequence_band), none where the
        window misses every sequence's pair, a plain piece where it covers every one."""
        out = []
        for q_part, k_part in _cp.window_pairs(balanced=self.balanced):
            m = _cp.chunk_index(rank, q_part, self.n, balanced=self.balanced) - \
                _cp.chunk_index(source, k_part, self.n, balanced=self.balanced)
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
            rows = _merged((_part(o, q_part, a), _part(lse, q_part, sa)), piece)
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


# --- the algorithm, over the ranks a process runs ------------------------------------------------

def _sink_partial(q, sink):
    """A learnable sink's share of every row: no value (O 0), the logit sink[h] (counted once, after
    the blocks, so that no block adds it again)."""
    o, stats = _neutral(q)
    return o, _merge.rows(sink.to(stats.dtype).expand(_merge.rows(stats).shape))


def _d_sink(o, stats, d_o, sink):
    """A sink's gradient from one rank's rows: -sum over rows of P_sink * rowsum(dO * O), P_sink =
    exp(sink - lse) (O = sum_j P_j v_j, and the sink moves every P_j by -P_sink)."""
    rows = (d_o.to(_wide(o)) * o.to(_wide(o))).sum(-1)  # O's rows: [b, s, h] or [tokens, h]
    return -(torch.exp(sink.to(stats.dtype) - _merge.rows(stats)) * rows).flatten(0, -2).sum(0)


def run_forward(qs, ks, vs, transport, blocks, *, causal, balanced, scheme, sink=None, window=None, packed=None):
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
                outs[j] = _merged(outs[j], kinds.forward(qs[j], *gathered[j][s], r, s))
    else:
        kv = list(zip(ks, vs))
        for t in range(n):  # at step t each rank holds the keys of rank r - t
            incoming = transport.shift(kv) if t < n - 1 else None  # travels while this step computes
            for j, r in enumerate(ranks):
                outs[j] = _merged(outs[j], kinds.forward(qs[j], *kv[j], r, (r - t) % n))
            if incoming is not None:
                kv = incoming.wait()
    if sink is not None:
        outs = [_merged(out, _sink_partial(q, sink)) for out, q in zip(outs, qs)]
    return outs


def run_backward(qs, ks, vs, os, stats, d_os, transport, blocks, *, causal, balanced, scheme, sink=None, window=None,
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
