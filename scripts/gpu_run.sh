#!/usr/bin/env bash
# Builds fusedattn on the GPU machine and runs every GPU check and benchmark in one go, writing
# the results file (DESIGN.md §8) and the benchmark outputs into $OUT (default: ./gpu-out).
#
#   bash scripts/gpu_run.sh            # everything
#   SKIP_BENCH=1 bash scripts/gpu_run.sh       # no benchmarks
#   VARLEN_BENCH_ONLY=1 bash scripts/gpu_run.sh  # only the ragged / paged benchmark (after the tests)
#   GPU_TESTS_ONLY=1 bash scripts/gpu_run.sh   # the GPU tier and the results file only
#
# FUSEDATTN_COMMIT=<sha> names the commit in the results file; pass it as a literal from the
# checkout that was sent (the device's copy of .git can lag behind the working tree).
#
# Exit status: non-zero when the build fails, any GPU test fails, or no GPU test ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_log.txt") 2>&1
export PYTHONUNBUFFERED=1
status=0

echo "== machine"
date -u +"%Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "commit: ${FUSEDATTN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"

echo "== build"
bash scripts/setup.sh
build=build-gpu
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DFUSEDATTN_PYTHON=ON >"$OUT/cmake.txt" 2>&1 \
  || { cat "$OUT/cmake.txt"; exit 1; }
grep "fusedattn:" "$OUT/cmake.txt"
ninja -C "$build" -j"$(nproc)" >/dev/null || { ninja -C "$build" -j1 2>&1 | tail -50; exit 1; }
"$build/fusedattn" info || status=1

if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== GPU tests"
  "$build/tests/fusedattn_gpu_tests" --gtest_output="xml:$OUT/gpu_tests.xml" 2>&1 | grep -v "^\[       OK \]" || true
  echo "== Python tests (fusedattn, fusedattn.torch) on the GPU"
  # JAX must not take most of the GPU up front: PyTorch's tests share the process.
  XLA_PYTHON_CLIENT_PREALLOCATE=false FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" \
    python3 -m pytest -q -rs tests/python -k "${PYTEST_FILTER:-}" \
    --junitxml="$OUT/python_tests.xml" 2>&1 | tail -40
  if [ -n "${GPU_TESTS_ONLY:-}" ]; then SKIP_BENCH=1; fi
fi
if [ -z "${SKIP_TESTS:-}" ] && [ -z "${GPU_TESTS_ONLY:-}" ]; then
  echo "== CPU tests and CLI (on the GPU machine too)"
  (cd "$build" && ctest -L cpu --output-on-failure 2>&1 | tail -5)
  echo "== demo"
  "$build/fusedattn" demo || status=1
  echo "== CLI on the GPU"
  "$build/fusedattn" run "layout=sbhd_sb2hd dtype=f16 b=3 s_q=999 s_kv=1501 h_q=8 h_kv=2 d=128 causal align=bottom_right" \
    || status=1
  "$build/fusedattn" support "layout=bshd b=1 s_q=64 s_kv=32 h=2 d=512 causal align=bottom_right" --pass both
  [ $? -eq 1 ] || status=1  # must be refused, with every reason
  "$build/fusedattn" bench "layout=bshd b=2 s=4096 h=16 d=128 causal" --iters 20 || status=1
fi

echo "== support matrix"
"$build/fusedattn" support-matrix --out "$OUT/support-matrix.md" || status=1

if [ -z "${SKIP_BENCH:-}" ]; then
  echo "== benchmark"
  if [ -z "${VARLEN_BENCH_ONLY:-}" ]; then
    python3 -X faulthandler bench/run_bench.py --lib "$build/libfusedattn_bench.so" --out "$OUT" --rounds 5 || status=1
  fi
  echo "== benchmark: ragged training step and paged decode"
  python3 -X faulthandler bench/run_bench_varlen.py --lib "$build/libfusedattn_bench.so" --out "$OUT" || status=1
fi

[ -n "${SKIP_TESTS:-}" ] && exit $status
echo "== results"
python3 scripts/gpu_results.py --xml "$OUT/gpu_tests.xml" "$OUT/python_tests.xml" --info-bin "$build/fusedattn" --out "$OUT/gpu_results.md" \
  || status=1
exit $status
