#!/usr/bin/env bash
# Every test tier: CPU (always), GPU (skips with its reason without a GPU), and the CLI. Arguments go
# to ctest (for example -L python or -LE python: one label's tests, or all but them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
log=$(mktemp)
set +e
ctest --output-on-failure -j "$(nproc)" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One plain closing line, whatever ctest listed last.
# ctest says "N% tests passed, F tests failed out of T", or "100% tests passed out of T" when none failed.
total=$(grep -oE 'tests (passed|failed) out of [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || echo 0)
failed=$(grep -oE '[0-9]+ tests failed out of' "$log" | grep -oE '^[0-9]+' || echo 0)
skipped=$(grep -c '(Skipped)$' "$log" || true)
echo "ctest: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
rm -f "$log"
exit "$status"
