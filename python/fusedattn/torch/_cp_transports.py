"""The transports context parallelism's schedule (_cp_schedule.py) moves blocks with: SimulatedRanks,
N ranks in one process with in-process copies (the algorithm's tests), and ProcessGroupTransport,
this process's rank of a torch.distributed group (NCCL's point-to-point sends and collectives on a
stream of their own, so that the next block travels while the current one is computed).

Each method takes and returns one entry per rank the transport runs (`ranks`): a block's tensors,
or a tensor to sum."""
import contextlib

import torch
import torch.distributed as dist


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
        self.group = group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.ranks = [self.rank]
        # NCCL: a stream of their own; a CPU group (gloo, the tests') runs on the host.
        self.stream = torch.cuda.Stream() if dist.get_backend(group) == "nccl" else None

    def _peer(self, offset):
        return dist.get_global_rank(self.group, (self.rank + offset) % self.n)

    def shift(self, per_rank):
        (tensors,) = per_rank
        tensors = [t.contiguous() for t in tensors]
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            received = [torch.empty_like(t) for t in tensors]
            ops = [dist.P2POp(dist.isend, t, self._peer(1), self.group) for t in tensors] + \
                  [dist.P2POp(dist.irecv, t, self._peer(-1), self.group) for t in received]
            requests = dist.batch_isend_irecv(ops)
        if self.stream is not None:
            for t in tensors:
                t.record_stream(self.stream)
        return _Received(requests, received, self.stream)

    def all_gather(self, per_rank):
        (tensors,) = per_rank
        gathered = []
        for t in tensors:
            out = [torch.empty_like(t) for _ in range(self.n)]
            dist.all_gather(out, t.contiguous(), group=self.group)
            gathered.append(out)
        return [[tuple(g[s] for g in gathered) for s in range(self.n)]]

    def all_reduce_sum(self, per_rank):
        (mine,) = per_rank
        total = mine.clone()
        dist.all_reduce(total, group=self.group)
        return [total]

    def reduce_scatter(self, per_rank):
        (mine,) = per_rank
        out = []
        for i in range(len(mine[0])):
            parts = [mine[s][i].contiguous() for s in range(self.n)]
            if self.stream is None:  # gloo has no reduce_scatter: the whole sum, this rank's part of it
                whole = torch.stack(parts)
                dist.all_reduce(whole, group=self.group)
                out.append(whole[self.rank])
                continue
            result = torch.empty_like(parts[0])
            dist.reduce_scatter(result, parts, group=self.group)
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
