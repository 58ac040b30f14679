#!/usr/bin/env python3
"""Writes the GPU results file (DESIGN.md §8) from the GPU tier's GoogleTest XML report.

Date, GPU, driver, cuDNN (compiled and loaded), counts passed / failed / skipped, every failure
with its spec string and every skip with its reason. Exits non-zero when a test failed or when no
GPU test ran at all (a GPU run that collects nothing must not look green).
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET


def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError as error:
        return f"({error})"


def without_location(message):
    """GoogleTest starts a skip message with 'file:line' and a newline; the reason is the rest."""
    first, _, rest = message.partition("\n")
    return rest if rest and re.fullmatch(r"\S+:\d+", first.strip()) else message


def collect(xml_path):
    cases = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        failure = case.find("failure")
        skipped = case.find("skipped")
        if failure is not None:
            cases.append((name, "failed", failure.get("message", "")))
        elif skipped is not None or case.get("result") == "skipped":
            message = skipped.get("message", "") if skipped is not None else ""
            cases.append((name, "skipped", without_location(message)))
        else:
            cases.append((name, "passed", ""))
    return cases


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--xml", required=True, nargs="+", help="JUnit XML files (GoogleTest's, pytest's)")
    parser.add_argument("--info-bin", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tier", default="GPU tier", help="what the reports cover, for the file's title line")
    parser.add_argument("--wall", default="", help="the run's wall time, as the tier's command reported it")
    args = parser.parse_args()

    cases = []
    for path in args.xml:  # a tier that crashed leaves no file: that is a failure, not an absence
        if os.path.exists(path) and os.path.getsize(path) > 0:
            cases += collect(path)
        else:
            cases.append((os.path.basename(path), "failed", "no results: the tier crashed or did not run "
                          "(gpu_log.txt has its output)"))
    counts = {kind: sum(1 for c in cases if c[1] == kind) for kind in ("passed", "failed", "skipped")}
    gpu = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    lines = [
        f"# GPU results: {args.tier}",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- commit: {os.environ.get('FUSEDATTN_COMMIT') or run(['git', 'rev-parse', '--short', 'HEAD']) or 'unknown'}",
        f"- GPU, driver: {gpu}",
        *([f"- test filter: `{os.environ['GTEST_FILTER']}` (a partial run: only the tests it selects)"]
          if os.environ.get("GTEST_FILTER") else []),
        *([f"- parts: {os.environ['PARTS']}"] if os.environ.get("PARTS") else []),
        *([f"- wall time: {args.wall}"] if args.wall else []),
        "- build:",
        "",
        "```",
        run([args.info_bin, "info"]),
        "```",
        "",
        f"**{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped** "
        f"({args.tier}, `scripts/gpu_run.sh`)",
        "",
    ]
    if counts["failed"]:
        lines += ["## Failures", ""]
        lines += [f"- `{name}`: {message}" for name, kind, message in cases if kind == "failed"]
        lines.append("")
    if counts["skipped"]:
        lines += ["## Skipped, with the reason", ""]
        lines += [f"- `{name}`: {message.strip()}" for name, kind, message in cases if kind == "skipped"]
        lines.append("")
    with open(args.out, "w") as out:
        out.write("\n".join(lines))
    print("\n".join(lines[:14]))
    if counts["failed"] or counts["passed"] == 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
