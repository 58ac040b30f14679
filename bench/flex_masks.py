"""The masks and biases the FlexAttention benchmarks share (run_bench_flex.py, flex_compatibility.py):
T5's bucketed relative position and documents cut at seeded random places."""
import math

import torch


def t5_bucket(relative, num_buckets=32, max_distance=128):
    """T5's bidirectional relative-position bucket, as transformers and FlexAttention's tests write it."""
    num_buckets //= 2
    buckets = (relative > 0).to(torch.long) * num_buckets
    relative = torch.abs(relative)
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(relative.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(relative < max_exact, relative, large)


def documents(length, count, device="cuda"):
    """Document ids [length] of `count` documents cut at places drawn with seed `count`."""
    generator = torch.Generator().manual_seed(count)
    cuts = torch.sort(torch.randperm(length - 1, generator=generator)[:count - 1] + 1).values
    ids = torch.zeros(length, dtype=torch.int64)
    ids[cuts] = 1
    return ids.cumsum(0).to(device)
