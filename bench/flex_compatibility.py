#!/usr/bin/env python3
"""bench/flex_compatibility.py — the score_mods and mask_mods FlexAttention's own tests and users
write, each through fusedattn.torch.flex_attention against float32 attention of the same function
on the whole score matrix, forward and backward: passed, refused (with fusedattn's reason),
failed (with the error that was over the tolerance) or crashed (the process died: the cases run in
a child process, a new one going on after such a case). Writes results/flex-compatibility.md.

    python bench/flex_compatibility.py --build build
"""
import argparse
import math
import subprocess
import sys
from pathlib import Path

import torch

from flex_masks import t5_bucket

TOLERANCE = 1e-2  # relative, BF16 inputs, as the GPU tests take it
_PER_HEAD = "bidirectional heads"  # the one mask that reads the head (its BlockMask is made per head)


def cases(device):
    """(name, score_mod or None, mask_mod or None) of each row."""
    slopes = torch.exp2(-torch.arange(1, 9, device=device, dtype=torch.float32))  # ALiBi, 8 heads
    table = torch.randn(8, 65, device=device) * 0.1  # a relative-position bias by clamped distance
    doc = (torch.arange(1024, device=device) // 100).clamp(max=9)
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    score_mods = {  # the identity beside each mask is the first group of rows
        "softcap 30": lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0),
        "ALiBi": lambda s, b, h, q, kv: s + slopes[h] * (kv - q),
        "relative position (clamped table)": lambda s, b, h, q, kv: s + table[h, (kv - q).clamp(-32, 32) + 32],
        "head offset": lambda s, b, h, q, kv: s + 0.1 * h,
        "T5 bucket bias": lambda s, b, h, q, kv: s + table[h, t5_bucket(kv - q, num_buckets=64)],
    }
    mask_mods = {
        "no mask": None,
        "causal": causal,
        "sliding window 128": lambda b, h, q, kv: (q >= kv) & (q - kv < 128),
        "prefix-LM 256": lambda b, h, q, kv: (q >= kv) | (kv < 256),
        "document": lambda b, h, q, kv: doc[q] == doc[kv],
        "document, causal": lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv),
        _PER_HEAD: lambda b, h, q, kv: (q >= kv) | (h % 2 == 0),
    }
    for mask_name, mask_mod in mask_mods.items():
        yield f"identity, {mask_name}", lambda s, b, h, q, kv: s, mask_mod
    for mod_name, score_mod in score_mods.items():
        for mask_name in ("no mask", "causal"):
            yield f"{mod_name}, {mask_name}", score_mod, mask_mods[mask_name]
    yield "softcap 30, sliding window 128", score_mods["softcap 30"], mask_mods["sliding window 128"]
    yield "ALiBi, document, causal", score_mods["ALiBi"], mask_mods["document, causal"]
    yield "relative position, prefix-LM 256", score_mods["relative position (clamped table)"], mask_mods["prefix-LM 256"]


def reference(q, k, v, score_mod, mask_mod):
    """float32 attention of score_mod and mask_mod evaluated on the whole score matrix."""
    b, h, s, d = q.shape
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
    grid = [torch.arange(n, device=q.device).view(*([1] * a), n, *([1] * (3 - a))) for a, n in enumerate((b, h, s, s))]
    if score_mod is not None:
        scores = score_mod(scores, *grid)
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(*grid).expand(scores.shape), float("-inf"))
    return torch.softmax(scores, -1) @ v.float()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check(fa, NotSupportedError, create_block_mask, score_mod, mask_mod, per_head):
    b, h, s, d = 2, 8, 1024, 64
    q, k, v = ((torch.rand(b, h, s, d, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_() for _ in "qkv")
    # A mask that reads the head needs its BlockMask made per head, as FlexAttention's does: one made
    # for all heads (H=None) holds head 0's blocks, and both FlexAttention and the drop-in take its
    # full blocks as full for every head.
    heads = h if per_head else None
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, None, heads, s, s, device="cuda")
    try:
        o = fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
    except NotSupportedError as error:
        return "refused", str(error).splitlines()[0][:200]
    inputs = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref = reference(*inputs, score_mod, mask_mod)
    d_o = torch.rand_like(o) * 2 - 1
    o.backward(d_o)
    ref.backward(d_o.float())
    errors = {"O": rel(o, ref)}
    errors.update({f"d{n}": rel(x.grad, y.grad) for n, x, y in zip("qkv", (q, k, v), inputs)})
    worst = max(errors, key=errors.get)
    if errors[worst] < TOLERANCE:
        return "passed", ", ".join(f"{n} {e:.1e}" for n, e in errors.items())
    return "failed", f"{worst} {errors[worst]:.3g} off"


def rows(build, first):
    """Prints each case's row from case `first` on, as it finishes (a parent process reads them)."""
    sys.path.insert(0, str(Path(build) / "python"))
    import fusedattn.torch as fa
    from fusedattn import NotSupportedError
    from torch.nn.attention.flex_attention import create_block_mask

    for name, score_mod, mask_mod in list(cases("cuda"))[first:]:
        try:
            result, detail = check(fa, NotSupportedError, create_block_mask, score_mod, mask_mod,
                                   per_head=name.endswith(_PER_HEAD))
        except Exception as error:  # one case must not hide the others
            result, detail = "failed", f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        print(f"| {name} | {result} | {detail.replace('|', '/')} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="results")
    parser.add_argument("--first", type=int, default=None, help=argparse.SUPPRESS)  # a child's first case
    args = parser.parse_args()
    if args.first is not None:
        return rows(args.build, args.first)
    # The cases run in a child process; one that crashes it (a signal, not an exception) is its row,
    # and a new child goes on from the next case, so that a crash hides no other case.
    names = [name for name, _, _ in cases("cpu")]
    lines = ["| score_mod, mask_mod | result | errors (relative, O and gradients) or reason |", "|---|---|---|"]
    done = 0
    while done < len(names):
        child = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--build", args.build,
                                "--first", str(done)], stdout=subprocess.PIPE, text=True)
        got = [line for line in child.stdout.splitlines() if line.startswith("| ")]
        for line in got:
            print(line, flush=True)
        lines += got
        done += len(got)
        if done < len(names):
            if child.returncode >= 0:  # an error outside the cases (its traceback is on stderr)
                raise SystemExit(f"flex_compatibility: the child stopped after {done} of {len(names)} cases "
                                 f"(exit status {child.returncode})")
            lines.append(f"| {names[done]} | crashed | the process died of signal {-child.returncode} |")
            print(lines[-1], flush=True)
            done += 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = (f"# FlexAttention compatibility: fusedattn.torch.flex_attention on {torch.cuda.get_device_name()}\n\n"
              f"b 2, h 8, s 1024, d 64, BF16, against float32 attention of the same functions; "
              f"passed under {TOLERANCE} relative for O, dQ, dK and dV.\n\n")
    (out / "flex-compatibility.md").write_text(header + "\n".join(lines) + "\n")
    crashed = sum(" | crashed | " in line for line in lines)
    if crashed:
        raise SystemExit(f"flex_compatibility: {crashed} case(s) crashed the process")


if __name__ == "__main__":
    main()
