#!/usr/bin/env python3
"""bench/run_bench_plans.py — what a plan costs a new process: built cold, then restored from the
disk cache (fusedattn/disk_cache.h), each in a fresh `fusedattn warmup` process on one thread, so
every number is one plan's own time; then the same with autotune (tuned cold, restored warm), and
a ragged training configuration's buckets warmed up on one thread and on eight.

    python bench/run_bench_plans.py --build build [--log FILE]   # writes results/bench-plans.*

Writes a markdown table and JSON. Target (issue 16): a restored plan in at most 5% of its cold build.
The first plan of each process also carries cuDNN's start-up (plan_specs.txt puts a small plan
there); the table marks its rows.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

LINE = re.compile(r"^(ready|not supported)\s+([0-9.]+) ms\s+(\w+)\s+\"(.*)\"$")
# The disk cache's log line of one restore (FUSEDATTN_LOG=1), with its stages.
LOAD = re.compile(r"disk_load ([0-9.]+) ms \(read ([0-9.]+), parse ([0-9.]+), finalize ([0-9.]+) ms; (\d+) KB\)")
RAGGED = "layout=thd_thd_thd b=16 s=2048 h=16 d=128 causal padding=1"


def warmup(cli, folder, args, echo, loads=None):
    """{(spec, pass): ms} of one `fusedattn warmup` process, and its total line. `loads`, a list,
    gets the stages of each restore the process logged: (total, read, parse, finalize ms, KB)."""
    env = dict(os.environ, FUSEDATTN_PLAN_DIR=folder, **({"FUSEDATTN_LOG": "1"} if loads is not None else {}))
    run = subprocess.run([str(cli), "warmup", *args], capture_output=True, text=True, env=env)
    echo.write(run.stdout + run.stderr)
    times = {}
    for line in run.stdout.splitlines():
        m = LINE.match(line.strip())
        if m and m.group(1) == "ready":
            times[(m.group(4), m.group(3))] = float(m.group(2))
    total = next((line for line in run.stdout.splitlines() if line.startswith("warmup:")), "")
    if loads is not None:
        loads += [tuple(float(x) for x in m.groups()) for m in map(LOAD.search, run.stderr.splitlines()) if m]
    return times, total


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="results", help="folder of the results (default: results)")
    parser.add_argument("--log", default=str(Path(tempfile.gettempdir()) / "bench-plans.log"),
                        help="the warm-up processes' raw output (a run's output folder, not the tree)")
    parser.add_argument("--specs", default=str(Path(__file__).with_name("plan_specs.txt")))
    args = parser.parse_args()
    cli = Path(args.build) / "fusedattn"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "bench-plans"  # one name, overwritten each run
    log = open(args.log, "w")
    rows, sections, stages = [], {}, {}
    for label, extra in (("heuristics", []), ("autotune", ["--autotune"])):
        with tempfile.TemporaryDirectory() as folder:
            cold, _ = warmup(cli, folder, ["--file", args.specs, "--pass", "both", "--threads", "1", *extra], log)
            loads = []
            warm, _ = warmup(cli, folder, ["--file", args.specs, "--pass", "both", "--threads", "1", *extra], log,
                             loads)
        stages[label] = {"restores": len(loads), "ready_ms": sum(warm.values()),
                         **{k: sum(x[i] for x in loads) for i, k in enumerate(("load_ms", "read_ms", "parse_ms",
                                                                               "finalize_ms", "kb"))}}
        for n, (key, ms) in enumerate(cold.items()):  # in the order the process readied them
            rows.append({"plans": label, "spec": key[0], "pass": key[1], "cold_ms": ms, "warm_ms": warm.get(key),
                         "ratio": warm[key] / ms if warm.get(key) else None, "first": n == 0})
    for threads in (1, 8):
        with tempfile.TemporaryDirectory() as folder:
            _, total = warmup(cli, folder, [RAGGED, "--buckets", "--pass", "both", "--threads", str(threads)], log)
        sections[f"ragged buckets, {threads} thread(s)"] = total
    lines = ["| plans | spec | pass | cold (ms) | restored in a new process (ms) | restored / cold (target ≤ 0.05) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["ratio"]
        mark = "" if ratio is None else (" ✓" if ratio <= 0.05 else " ✗")
        warm = "–" if r["warm_ms"] is None else f"{r['warm_ms']:.2f}"
        ratio_text = "–" if ratio is None else f"{ratio:.3f}{mark}"
        first = " (a process's first plan: cuDNN's start-up)" if r["first"] else ""
        lines.append(f"| {r['plans']} | `{r['spec']}`{first} | {r['pass']} | {r['cold_ms']:.1f} | {warm} | {ratio_text} |")
    lines.append("")
    for label, st in stages.items():  # where a new process's restores spend their time, summed
        if st["restores"]:
            lines.append(f"- where the {label} restores' time goes ({st['restores']} plans read, "
                         f"{st['kb'] / st['restores']:.0f} KB each on average): ready in {st['ready_ms']:.1f} ms "
                         f"in all, of which reading the files {st['read_ms']:.1f}, parsing the frontend's UBJSON "
                         f"{st['parse_ms']:.1f}, cuDNN finalizing the plans {st['finalize_ms']:.1f}, and the rest "
                         f"(support policy, the plan object, the first restore's cuDNN start-up) "
                         f"{st['ready_ms'] - st['load_ms']:.1f}")
    lines += [f"- {k} (`fusedattn warmup \"{RAGGED}\" --buckets --pass both`): {v}" for k, v in sections.items()]
    table = "\n".join(lines)
    (out / f"{name}.md").write_text(table + "\n")
    summary = {"rows": rows, "ragged": sections, "stages": stages, "argv": sys.argv}
    (out / f"{name}.json").write_text(json.dumps(summary, indent=2))
    print(table)
    return 0 if rows and all(r["warm_ms"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
