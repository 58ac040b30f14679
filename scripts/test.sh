#!/usr/bin/env bash
# Every test tier: CPU (always), GPU (skips with its reason without a GPU), and the CLI. Arguments go
# to ctest (for example -L python or -LE python: one label's tests, or all but them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
log=$(mktemp)
rm -rf test-reports && mkdir test-reports  # this run's JUnit reports only (tests/CMakeLists.txt)
started=$SECONDS
set +e
ctest --output-on-failure -j "$(nproc)" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo "ctest: $((SECONDS - started)) s of wall time"
# One plain closing line, whatever ctest listed last.
# ctest says "N% tests passed, F tests failed out of T" (or "100% tests passed out of T" when none
# failed); its "passed" includes the skipped ones (a GPU test without a GPU, a Python file whose
# every test skipped), which its progress lines mark "***Skipped". Only those lines are counted: a
# failing test's output, printed among them, is not.
total=$(grep -oE 'tests (passed|failed) out of [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
failed=$(grep -oE '[0-9]+ tests failed out of' "$log" | grep -oE '^[0-9]+' | tail -1 || true)
skipped=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Skipped +[0-9.]+ sec$' "$log" || true)
echo "ctest: $((${total:-0} - ${failed:-0} - skipped)) passed, ${failed:-0} failed, $skipped skipped"
rm -f "$log"
exit "$status"
