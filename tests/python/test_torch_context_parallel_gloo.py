"""fusedattn.torch.context_parallel_attention across processes without a GPU: one gloo group of 4
processes (the process-group transport's point-to-point sends and collectives), with the float64
stand-in kernels of torch_cp_reference.py, each rank's O and gradients against its part of the whole
sequence's answer (of each sequence's own, packed): ring and all-gather, causal and not, a sink, a
window, packed sequences."""
import os
import re
import subprocess
import sys
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

import torch.distributed as dist  # noqa: E402

from fusedattn.torch import _context_parallel as cp  # noqa: E402
from torch_cp_reference import (H_KV, PACKED_LENGTHS, ReferenceBlocks, expected, packed_problem,  # noqa: E402
                                problem, sink_logits)


class GlooConfig(NamedTuple):
    """One configuration the gloo group checks; left > 0: a causal sliding window of that many keys."""
    scheme: str
    causal: bool
    balanced: bool
    with_sink: bool = False
    left: int = -1
    packed: bool = False


# One group of four processes checks them all, one after another: a group costs seconds of CPU to
# start (each process its interpreter and torch), a configuration milliseconds.
GLOO_CONFIGS = {
    "ring_causal": GlooConfig("ring", True, True), "all_gather_causal": GlooConfig("all_gather", True, True),
    "ring_full": GlooConfig("ring", False, False), "all_gather_full": GlooConfig("all_gather", False, False),
    "ring_causal_sink": GlooConfig("ring", True, True, with_sink=True),
    "ring_window": GlooConfig("ring", True, False, left=40),
    "ring_causal_packed_sink": GlooConfig("ring", True, True, with_sink=True, packed=True),
    "all_gather_packed_window": GlooConfig("all_gather", True, True, left=13, packed=True),
}


def gloo_rank_agrees(rank, n, config):
    """This process's rank of the group through context_parallel_attention (its part of q, k, v;
    its O and gradients) against its part of the whole sequence's answer."""
    window = (config.left, 0) if config.left > 0 else None
    if config.packed:  # a packed batch (thd), each rank its chunks of every sequence
        q, k, v, d_o, cu = packed_problem(H_KV, PACKED_LENGTHS)
        arrange, axis = lambda x: cp.load_balance(x, n, cu_seqlens=cu, balanced=config.balanced), 0
        want = expected(config.causal, window, config.with_sink, lengths=PACKED_LENGTHS)
    else:
        q, k, v, d_o = problem(H_KV)
        arrange = (lambda x: cp.load_balance(x, n)) if config.balanced else (lambda x: x)
        cu, axis = None, 1
        want = expected(config.causal, window, config.with_sink)
    mine = lambda x: arrange(x).chunk(n, axis)[rank].clone()
    leaves = [mine(x).requires_grad_() for x in (q, k, v)]
    sink = sink_logits(q.shape[-2]).requires_grad_() if config.with_sink else None
    o = cp.context_parallel_attention(*leaves, causal=config.causal, window=window or (-1, -1), scheme=config.scheme,
                                      load_balanced=config.balanced, sink=sink, cu_seqlens=cu,
                                      blocks=ReferenceBlocks(q.shape[-1] ** -0.5))
    o.backward(mine(d_o))
    ok = torch.allclose(o, mine(want.o), atol=1e-10)
    for leaf, want_grad in zip(leaves, want.grads):
        ok = ok and torch.allclose(leaf.grad, mine(want_grad), atol=1e-9)
    if config.with_sink:  # summed over the ranks: every rank holds the whole gradient
        ok = ok and torch.allclose(sink.grad, want.d_sink, atol=1e-9)
    return ok


def gloo_rank(rank, n, store):
    """One process of the group (forked from `python this_file.py STORE`): every configuration."""
    torch.set_num_threads(1)  # four ranks on the machine, tensors of a few thousand elements
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
    for name, config in GLOO_CONFIGS.items():
        print(f"RANK {rank} {name} {'OK' if gloo_rank_agrees(rank, n, config) else 'WRONG'}", flush=True)
    dist.destroy_process_group()


def test_a_gloo_group_of_four_processes_equals_the_whole_sequence(tmp_path):
    # A fresh interpreter forks the four ranks once it has imported torch and this file: they share
    # that import. The group meets in a file store, so no port is chosen that another test might hold.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, __file__, str(tmp_path / "store")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    # The four processes share stdout: their lines may run into each other.
    seen = sorted(re.findall(r"RANK (\d) (\w+) (OK|WRONG)", done.stdout))
    wrong = [f"rank {rank}: {name}" for rank, name, verdict in seen if verdict != "OK"]
    assert seen == sorted((str(r), name, "OK") for r in range(4) for name in GLOO_CONFIGS), (wrong, done.stdout)


if __name__ == "__main__":  # the gloo group of test_a_gloo_group_of_four_processes_equals_the_whole_sequence
    torch.multiprocessing.start_processes(gloo_rank, args=(4, sys.argv[1]), nprocs=4, start_method="fork")
