#!/usr/bin/env python3
"""bench/run_bench_decode.py — decode on the user path, beside PyTorch in one process: one to 16
query tokens a sequence over a BF16 K/V cache (h 32/8, d 128), and over the same cache in FP8 (E4M3,
descales per K/V head, checked against the call on its dequantized copy), through fusedattn.torch.paged_attention
on 64-token pages in a shuffled pool and fusedattn.torch.attention on a contiguous copy, against
PyTorch SDPA's cuDNN backend on that copy; each captured in a CUDA graph alone, and 8 to a graph (as
serving engines capture a decode step of several layers: the graph's own start shared), and eager
(a loop of calls, host time included). Every fusedattn call is timed three
ways: as the support rule picks its kernel (this process), and forced onto fusedattn's decode kernel
and onto cuDNN's path (FUSEDATTN_DECODE_KERNEL=1 and 0, read once a process: a child each). Times
are fractions of the copy bandwidth measured in the same run (K and V read once).

    python bench/run_bench_decode.py --build build   # writes results/bench-decode.{json,md}

One query is causal bottom-right; several run without a mask on every side (PyTorch's dense call
has no bottom-right causal mask to match).
"""
import argparse
import datetime
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import captured_median_ms, cuda_median_ms, host_us, load, short

H_Q, H_KV, D, PAGE = 32, 8, 128, 64
POINTS = [(1, 1, 512), (1, 1, 2048), (1, 1, 8192), (1, 1, 32768), (2, 1, 8192), (2, 1, 32768), (4, 1, 8192),
          (4, 1, 32768), (8, 1, 8192), (8, 1, 32768), (64, 1, 8192),
          (4, 8, 8192), (4, 16, 8192), (1, 16, 32768)]
FORCED = {"kernel": "1", "cudnn": "0"}
# A serving engine captures a whole decode step, one call a layer, in one graph: the "step" columns
# time STEP calls captured together, a call's share of it, where a graph of one call also pays the
# graph's own start each time.
STEP = 8


def step(call):
    for _ in range(STEP):
        call()


def copy_bandwidth():
    """Bytes a second of a plain device copy (read + write), the ceiling decode is held to, timed
    as enqueued: captured in a CUDA graph (a memcpy node there) it measured 2.76 TB/s on the H200,
    against the 4.2 of the same copy enqueued."""
    x = torch.empty(2 ** 30, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    return 2 * x.numel() / (cuda_median_ms(lambda: y.copy_(x), 3, 10) * 1e-3)


def problem(batch, queries, seq_kv):
    """q, the page pools, shuffled tables and lengths, and a contiguous copy of the same cache."""
    pages = batch * seq_kv // PAGE
    k_pool = torch.rand(pages, PAGE, H_KV, D, device="cuda", dtype=torch.bfloat16)
    v_pool = torch.rand_like(k_pool)
    table_k = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(batch, seq_kv // PAGE)
    table_v = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(batch, seq_kv // PAGE)
    q = torch.rand(batch, queries, H_Q, D, device="cuda", dtype=torch.bfloat16)
    lengths = torch.full((batch,), seq_kv, device="cuda", dtype=torch.int32)
    k = k_pool[table_k.long()].reshape(batch, seq_kv, H_KV, D)
    v = v_pool[table_v.long()].reshape(batch, seq_kv, H_KV, D)
    return q, k_pool, v_pool, table_k, table_v, lengths, k, v


def fp8_pool(pool):
    """A pool in E4M3 with its descales, one a K/V head (pool ~ pool8 * descale), as serving engines
    keep an FP8 cache; and its dequantized copy, what the FP8 call is checked against."""
    descale = (pool.float().abs().amax(dim=(0, 1, 3)) / 448.0).contiguous()
    pool8 = (pool.float() / descale[:, None]).to(torch.float8_e4m3fn)
    return pool8, descale, (pool8.float() * descale[:, None]).to(pool.dtype)


def fusedattn_calls(fa, batch, queries, seq_kv, forced):
    """Each call and the K/V bytes it reads; the FP8 cache only where nothing is forced (cuDNN takes
    none, so forcing it would only refuse the call)."""
    q, k_pool, v_pool, table_k, table_v, lengths, k, v = problem(batch, queries, seq_kv)
    causal = queries == 1
    (k8, descale_k, k_back), (v8, descale_v, v_back) = fp8_pool(k_pool), fp8_pool(v_pool)

    def paged():
        return fa.paged_attention(q, k_pool, v_pool, table_k, table_v, lengths, causal=causal)

    def paged_fp8():
        return fa.paged_attention(q, k8, v8, table_k, table_v, lengths, causal=causal, descale_k=descale_k,
                                  descale_v=descale_v)

    def paged_dequantized():  # the FP8 call's reference: the same call on the dequantized pools
        return fa.paged_attention(q, k_back, v_back, table_k, table_v, lengths, causal=causal)

    def contiguous():
        return fa.attention(q, k, v, layout="bshd", causal=causal, align="bottom_right")
    torch_q, torch_k, torch_v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def pytorch():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(torch_q, torch_k, torch_v, enable_gqa=True)
    # The same answer on every side, before anything is timed.
    with torch.no_grad():
        expected = pytorch().transpose(1, 2).float()
        checks = [(paged, expected), (contiguous, expected)]
        if not forced:
            checks.append((paged_fp8, paged_dequantized().float()))
        for call, reference in checks:
            error = ((call().float() - reference).norm() / reference.norm()).item()
            if not error < 1e-2:
                raise AssertionError(f"{call.__name__}: relative error {error:.3g} against its reference")
    kv_bytes = 2 * k.numel() * k.element_size()
    calls = {"paged": (paged, kv_bytes), "contiguous": (contiguous, kv_bytes), "pytorch": (pytorch, kv_bytes)}
    if not forced:
        calls["paged_fp8"] = (paged_fp8, kv_bytes // 2)
    return calls


def measure(fa, library, forced, bandwidth):
    """Each point's times in this process: every call captured, the eager ones where nothing is forced."""
    rows = []
    for batch, queries, seq_kv in POINTS:
        row = {"b": batch, "s_q": queries, "s_kv": seq_kv}
        try:
            calls = fusedattn_calls(fa, batch, queries, seq_kv, forced)
            with torch.no_grad():
                for name, (call, kv_bytes) in calls.items():
                    if forced and name == "pytorch":
                        continue
                    for mode, timed in (("graph", lambda c=call: captured_median_ms(c, 3, 20) * 1e3),
                                        ("step", lambda c=call: captured_median_ms(lambda: step(c), 3, 20) * 1e3
                                         / STEP),
                                        ("eager", lambda c=call: host_us(c, 200, until_done=True))):
                        if forced and mode != "graph":
                            continue
                        us = timed()
                        row[f"{name}_{mode}_us"] = us
                        row[f"{name}_{mode}_fraction"] = kv_bytes / (us * 1e-6) / bandwidth
            row["kernel"] = library.check_support(paged_spec(batch, queries, seq_kv), "forward").kernel
        except Exception as error:  # noqa: BLE001
            row["error"] = short(error)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def paged_spec(batch, queries, seq_kv):
    """The paged call's spec string, for check_support's `kernel` (which kernels run it)."""
    causal = " causal align=bottom_right" if queries == 1 else ""
    return (f"layout=bshd_paged_bshd dtype=bf16 b={batch} s_q={queries} s_kv={seq_kv} h_q={H_Q} h_kv={H_KV} "
            f"d={D} page_size={PAGE} pages={batch * seq_kv // PAGE}{causal}")


def forced_rows(args, forced):
    """measure() in a child with FUSEDATTN_DECODE_KERNEL set."""
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, FUSEDATTN_DECODE_KERNEL=FORCED[forced])
        done = subprocess.run([sys.executable, __file__, "--build", args.build, "--out", folder, "--child", forced],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"the {forced} child failed:\n{done.stderr[-2000:]}", flush=True)
            return []
        return json.loads((Path(folder) / "child.json").read_text())


def fmt(row, key):
    us, fraction = row.get(f"{key}_us"), row.get(f"{key}_fraction")
    return "–" if us is None else f"{us:.1f} ({fraction:.2f})"


def markdown(rows, bandwidth):
    columns = [("paged_graph", "paged, graph"), ("paged_step", f"paged, {STEP} a graph"),
               ("paged_eager", "paged, eager"),
               ("kernel_paged_graph", "paged on the kernel"), ("cudnn_paged_graph", "paged on cuDNN"),
               ("contiguous_graph", "contiguous, graph"), ("kernel_contiguous_graph", "contiguous on the kernel"),
               ("cudnn_contiguous_graph", "contiguous on cuDNN"), ("paged_fp8_graph", "paged FP8 cache, graph"),
               ("paged_fp8_eager", "paged FP8 cache, eager"), ("pytorch_graph", "PyTorch cuDNN, graph"),
               ("pytorch_step", f"PyTorch cuDNN, {STEP} a graph"), ("pytorch_eager", "PyTorch cuDNN, eager")]
    lines = [f"## Decode through fusedattn.torch (BF16, h {H_Q}/{H_KV}, d {D}, {PAGE}-token pages), µs (fraction "
             f"of the {bandwidth / 1e12:.2f} TB/s copy bandwidth)", "",
             "fusedattn columns without \"on\": as the rule picks (its choice in the last column); \"on the "
             f"kernel\" / \"on cuDNN\": forced by FUSEDATTN_DECODE_KERNEL in a process of its own; \"{STEP} a graph\": "
             f"{STEP} calls captured in one graph, as a decode step of {STEP} layers, a call's share. One query "
             "causal bottom-right, several without a mask. The FP8 cache (E4M3, descales per K/V head) reads "
             "half the bytes: its fraction is of those.", "",
             "| b | s_q | s_kv | " + " | ".join(title for _, title in columns) + " | rule's choice (paged) |",
             "|---" * (len(columns) + 4) + "|"]
    for r in rows:
        cells = [fmt(r, key) for key, _ in columns]
        lines.append(f"| {r['b']} | {r['s_q']} | {r['s_kv']} | " + " | ".join(cells) +
                     f" | {r.get('kernel', '')} {' '.join(v for k, v in r.items() if k.endswith('error'))} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build", help="the build folder (FUSEDATTN_PYTHON=ON); default: build")
    parser.add_argument("--out", default="results", help="folder of the results (default: results)")
    parser.add_argument("--name", default="bench-decode", help="file stem, overwritten each run")
    parser.add_argument("--child", choices=sorted(FORCED), help=argparse.SUPPRESS)
    args = parser.parse_args()
    _, fa = load(args.build)
    library = importlib.import_module("fusedattn")  # the build's, which load() put first on the path
    if fa is None:
        raise SystemExit("fusedattn.torch is needed: build with FUSEDATTN_PYTHON=ON beside PyTorch")
    bandwidth = copy_bandwidth()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        rows = measure(fa, library, args.child, bandwidth)
        for row in rows:
            row.pop("kernel", None)
        (out / "child.json").write_text(json.dumps(rows))
        return 0
    rows = measure(fa, library, None, bandwidth)
    for forced in FORCED:
        for row, other in zip(rows, forced_rows(args, forced)):
            kept = {key: value for key, value in other.items() if key.endswith(("_us", "_fraction", "error"))}
            row.update({f"{forced}_{key}": value for key, value in kept.items()})
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
              "build_info": str(library.build_info()), "torch": torch.__version__,
              "argv": sys.argv, "copy_bandwidth_bytes_per_s": bandwidth, "decode": rows}
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=2, default=str))
    table = markdown(rows, bandwidth)
    (out / f"{args.name}.md").write_text(table)
    print(table, flush=True)
    return 1 if any(key.endswith("error") for row in rows for key in row) else 0


if __name__ == "__main__":
    sys.exit(main())
