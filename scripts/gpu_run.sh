#!/usr/bin/env bash
# Builds fusedattn on the GPU machine and runs every GPU check and benchmark in one go, writing
# the results file (DESIGN.md §8) and the raw logs into $OUT (default: ./gpu-out), and each
# benchmark's one file name into $OUT/results/ (bench-attention.json, bench-jax.json, ...: the
# names they have under results/ in the tree, overwritten by each run; copy them over to keep them).
#
#   bash scripts/gpu_run.sh                          # everything
#   PARTS="gtest torch" bash scripts/gpu_run.sh      # only the named parts
#
# Parts: gtest (the C++ GPU tier), torch and jax (the Python tiers on the GPU, each in its own
# process), cli (CPU tier, demo and CLI checks on this machine), testsh (the README's own test
# command, `bash scripts/test.sh`: its own build in build/ and every tier through
# `ctest -j $(nproc)`, so GPU tests run in parallel on this one GPU; log in $OUT/test_sh.txt;
# TESTSH_ARGS goes to ctest: "-LE python" and "-L python" split it in two calls under 600 s each),
# matrix (the support matrix from this GPU), bench (PyTorch comparison), fp8bench (FP8 beside BF16,
# the CLI's bench), fp8scaling (the FP8 element kernels' bandwidth against the GPU's copy), fp8api (FP8
# beside BF16 through fusedattn.torch, eager and compiled, and through fusedattn.jax), modbench
# (a softcap score modifier beside plain attention), decode (decode through fusedattn.torch on
# the decode kernel and on cuDNN beside PyTorch: results/bench-decode.*), flexbench (flex_attention beside compiled
# FlexAttention on its users' masks), flexcompat (its users' score_mods and mask_mods against float32
# attention: results/flex-compatibility.md), transformersbench (Llama- and Gemma-2-style models of
# about 1B with attn_implementation="fusedattn" beside "sdpa": results/bench-transformers.*), varlen (ragged step and
# paged decode), decodeprof (a split decode's kernels, their timeline and the calls by chunk count;
# not in the default list), decodencu (Nsight Compute over a decode call's kernels, the rule's cut and
# forced ones, beside PyTorch's: DECODENCU_ARGS; not in the default list), flexprof (flex_attention training steps of FLEXPROF_CASES, host time, kernels and Python functions, with replay on and off (FLEXPROF_REPLAY="1 0"), into $OUT/flex_step_profile_replay*.txt; not in the default list), transformersprof (a transformers model's decode steps profiled, fusedattn beside
# sdpa, into $OUT/transformers_decode_profile.txt: TRANSFORMERSPROF_ARGS; not in the default list), jaxbench (JAX comparison), kernels (the kernels each side of a training step launches,
# fusedattn.torch beside PyTorch's cuDNN backend, with the cuDNN frontend's log of both graphs), plans
# (plans built cold and restored from the disk cache in new processes, with and without autotune),
# sanitizer (compute-sanitizer's memcheck and racecheck over a part of the GPU tier: MEMCHECK_FILTER,
# RACECHECK_FILTER), tsan (ThreadSanitizer over the threads test, in a build of its own: TSAN_FILTER,
# TSAN_THREADS_CALLS), cudnn (the GPU tiers under each other cuDNN named in CUDNN_ALT, folders from
# scripts/cudnn_libs.sh; not in the default list), soak (the soak alone, SOAK_SPECS draws under each cuDNN of
# SOAK_CUDNN: "pinned" and CUDNN_ALT's folders; not in the default list). GTEST_SHARDS=N runs the GPU tier as N processes side by side, the Serial*
# tests alone after them. The results file covers the gtest and Python parts
# that ran; testsh reports its own counts (test.sh's closing "ctest:" line) and fails the run
# when it fails. BENCH_ARGS goes to
# bench/run_bench.py; GTEST_FILTER and PYTEST_FILTER (a pytest -k expression) narrow the test parts.
#
# FUSEDATTN_COMMIT=<sha> names the commit in the results file; pass it as a literal from the
# checkout that was sent (the device's copy of .git can lag behind the working tree).
#
# Exit status: non-zero when the build fails, any test fails or crashes, or no GPU test ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
export PARTS=${PARTS:-gtest torch jax cli testsh matrix bench fp8bench fp8scaling fp8api modbench decode flexbench flexcompat transformersbench varlen jaxbench kernels plans sanitizer tsan}
RESULTS=$OUT/results  # the benchmarks' files, named as in the tree's results/
mkdir -p "$OUT" "$RESULTS"
exec > >(tee "$OUT/gpu_log.txt") 2>&1
export PYTHONUNBUFFERED=1
status=0
# Whether part $1 was asked for; when it was, the run's elapsed seconds, so each part's time can be read.
part() { [[ " $PARTS " == *" $1 "* ]] && echo "-- part $1 at ${SECONDS} s"; }

echo "== machine"
date -u +"%Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "commit: ${FUSEDATTN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}; parts: $PARTS"

echo "== build"
# The README's own build (scripts/build.sh into build/), for SM 9.0 alone unless CUDAARCHS says
# otherwise; test.sh then finds it done, and every part runs from it: one build per machine.
build=build
CUDAARCHS=${CUDAARCHS:-90} bash scripts/build.sh >"$OUT/build.txt" 2>&1 || { tail -50 "$OUT/build.txt"; exit 1; }
grep "fusedattn:" "$OUT/build.txt" || true
"$build/fusedattn" info || status=1
xmls=()

if part gtest; then
  echo "== GPU tests"
  shards=${GTEST_SHARDS:-1}
  if [ "$shards" -le 1 ]; then
    # The whole output into a file as it comes (a run cut short by the device's time limit keeps
    # what ran: the XML report is written only at the end), the log without the OK lines.
    "$build/tests/fusedattn_gpu_tests" --gtest_output="xml:$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.txt" \
      | grep --line-buffered -v "^\[       OK \]" || true
    xmls+=("$OUT/gpu_tests.xml")
  else
    # GTEST_SHARDS processes side by side on the one GPU (most tests are bound by host work and
    # launches), then the Serial* tests alone: they read device-wide state.
    filter=${GTEST_FILTER:-*}
    pids=()
    for ((i = 0; i < shards; i++)); do
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$build/tests/fusedattn_gpu_tests" \
        --gtest_filter="${filter}-Serial*" --gtest_output="xml:$OUT/gpu_tests_$i.xml" >"$OUT/gpu_tests_$i.txt" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || true; done
    for ((i = 0; i < shards; i++)); do
      grep -E "^\[  FAILED  \]|^\[  PASSED  \]|tests ran" "$OUT/gpu_tests_$i.txt" | sed "s/^/shard $i: /" || true
      xmls+=("$OUT/gpu_tests_$i.xml")
    done
    GTEST_FILTER="" "$build/tests/fusedattn_gpu_tests" --gtest_filter="Serial*" \
      --gtest_output="xml:$OUT/gpu_tests_serial.xml" 2>&1 | tee "$OUT/gpu_tests_serial.txt" \
      | grep --line-buffered -v "^\[       OK \]" || true
    xmls+=("$OUT/gpu_tests_serial.xml")
  fi
fi

# One pytest process per framework (a crash in one still leaves the other's results), the full
# output kept; a crash is re-run under cuda-gdb for the native stack.
pytest_tier() {
  local name=$1; shift
  echo "== Python tests: $name"
  XLA_PYTHON_CLIENT_PREALLOCATE=false FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" \
    python3 -m pytest -q -rs -p no:cacheprovider ${PYTEST_FILTER:+-k "$PYTEST_FILTER"} "$@" --junitxml="$OUT/python_$name.xml" >"$OUT/python_$name.txt" 2>&1
  local rc=$?
  tail -30 "$OUT/python_$name.txt"
  xmls+=("$OUT/python_$name.xml")
  if [ $rc -ge 128 ] || [ ! -s "$OUT/python_$name.xml" ]; then
    echo "pytest ($name) crashed (exit $rc); native stack:"
    XLA_PYTHON_CLIENT_PREALLOCATE=false FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" timeout 300 \
      cuda-gdb -q -batch -ex run -ex bt --args python3 -m pytest -x -q -p no:cacheprovider "$@" 2>&1 \
      | grep -E "^#|signal|Segmentation|Error" | head -60
    status=1
  fi
}
if part torch; then
  pytest_tier torch tests/python --ignore=tests/python/test_jax_gpu.py --ignore=tests/python/test_flax.py
fi
if part jax; then
  pytest_tier jax tests/python/test_jax_gpu.py tests/python/test_flax.py
fi

if part cli; then
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

if part testsh; then
  echo "== bash scripts/test.sh (the README's test command: every tier, ctest -j $(nproc))"
  bash scripts/test.sh ${TESTSH_ARGS:-} >"$OUT/test_sh.txt" 2>&1
  rc=$?
  grep -E "^ctest: |tests passed|\*\*\*Failed|\(Failed\)|\(Timeout\)|Exception" "$OUT/test_sh.txt" | tail -40
  [ $rc -eq 0 ] || { echo "scripts/test.sh failed (exit $rc): see test_sh.txt"; status=1; }
  # The results files of the README's test command, one per tier, from each case's JUnit report.
  wall=$(grep -oE "^ctest: [0-9]+ s of wall time" "$OUT/test_sh.txt" | grep -oE "[0-9]+ s" || true)
  mkdir -p "$RESULTS"
  python3 scripts/gpu_results.py --xml build/test-reports/gpu_*.xml --info-bin build/fusedattn \
    --tier "C++ GPU tier through bash scripts/test.sh" --wall "${wall:-unknown} (all tiers together, ctest -j $(nproc))" \
    --out "$RESULTS/gpu-results.md" >/dev/null || status=1
  python3 scripts/gpu_results.py --xml build/test-reports/python_*.xml --info-bin build/fusedattn \
    --tier "Python tier (PyTorch and JAX adapters) through bash scripts/test.sh" \
    --wall "${wall:-unknown} (all tiers together, ctest -j $(nproc))" --out "$RESULTS/gpu-results-adapters.md" >/dev/null || status=1
fi

# The other GPU checks and the benchmarks, one file each (sourced: they share part(), status and the paths).
. scripts/gpu_checks.sh
. scripts/gpu_benchmarks.sh

if [ ${#xmls[@]} -gt 0 ]; then
  echo "== results"
  python3 scripts/gpu_results.py --xml "${xmls[@]}" --info-bin "$build/fusedattn" --out "$OUT/gpu_results.md" \
    || status=1
fi
# The device returns only a handful of files: the tests' raw outputs travel as one archive
# (tests.tar.gz: the XML reports, each pytest tier's full output, test.sh's log, the cudnn part's logs).
raw=$(cd "$OUT" && ls gpu_tests*.xml gpu_tests*.txt python_*.xml python_*.txt test_sh.txt cudnn-*.txt soak-*.txt sanitizer_*.txt tsan.txt 2>/dev/null)
if [ -n "$raw" ]; then
  # shellcheck disable=SC2086  # a list of file names without spaces
  (cd "$OUT" && tar czf tests.tar.gz $raw && rm -f $raw)
fi
exit $status
