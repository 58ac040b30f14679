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
# not in the default list), jaxbench (JAX comparison), kernels (the kernels each side of a training step launches,
# fusedattn.torch beside PyTorch's cuDNN backend, with the cuDNN frontend's log of both graphs), plans
# (plans built cold and restored from the disk cache in new processes, with and without autotune),
# sanitizer (compute-sanitizer's memcheck and racecheck over a part of the GPU tier: MEMCHECK_FILTER,
# RACECHECK_FILTER), tsan (ThreadSanitizer over the threads test, in a build of its own: TSAN_FILTER,
# TSAN_THREADS_CALLS), cudnn (the GPU tiers under each other cuDNN named in CUDNN_ALT, folders from
# scripts/cudnn_libs.sh; not in the default list). GTEST_SHARDS=N runs the GPU tier as N processes side by side, the Serial*
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
part() { [[ " $PARTS " == *" $1 "* ]]; }

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

if part cudnn; then
  # The GPU tiers (C++ and Python, through the README build's ctest) again under each other cuDNN in
  # CUDNN_ALT: folders that scripts/cudnn_libs.sh packs from a nvidia-cudnn-cu13 wheel and unpacks
  # here. The library stays built against the pinned headers and loads the other through
  # LD_LIBRARY_PATH, as it does beside a PyTorch that brings a newer cuDNN. One results file per
  # version: $RESULTS/gpu-results-cudnn-<version>.md.
  for dir in ${CUDNN_ALT:-}; do
    [ -d "$dir/lib" ] || bash scripts/cudnn_libs.sh unpack "$dir" || { status=1; continue; }
    version=$(basename "$dir")
    echo "== GPU tiers with cuDNN $version ($dir/lib)"
    alt_path="$(cd "$dir/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    LD_LIBRARY_PATH=$alt_path build/fusedattn info | grep -i cudnn
    rm -rf build/test-reports && mkdir -p build/test-reports
    started=$SECONDS
    (cd build && LD_LIBRARY_PATH=$alt_path ctest -L "gpu|python" -j "$(nproc)" --output-on-failure) \
      >"$OUT/cudnn-$version.txt" 2>&1 || status=1
    grep -E "tests passed|\(Failed\)|\(Timeout\)" "$OUT/cudnn-$version.txt" | tail -20
    LD_LIBRARY_PATH=$alt_path python3 scripts/gpu_results.py --xml build/test-reports/*.xml --info-bin build/fusedattn \
      --tier "GPU tiers (C++ and Python) under cuDNN $version, through ctest -L 'gpu|python'" \
      --wall "$((SECONDS - started)) s" --out "$RESULTS/gpu-results-cudnn-$version.md" >/dev/null || status=1
  done
fi

if part fp8scaling; then
  echo "== FP8 element kernels against the GPU's copy (64 MB a tensor)"
  "$build/fusedattn_fp8_bandwidth" --json "$RESULTS/bench-fp8-scaling.json" | tee "$RESULTS/bench-fp8-scaling.txt" || status=1
fi

if part matrix; then
  echo "== support matrix"
  "$build/fusedattn" support-matrix --out "$OUT/support-matrix.md" || status=1
fi

if part bench; then
  echo "== benchmark: fusedattn (C++ and fusedattn.torch) against PyTorch"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments (--shapes none: the host section only)
  python3 -X faulthandler bench/run_bench.py --build "$build" --out "$RESULTS" --rounds 5 ${BENCH_ARGS:-} || status=1
  python3 bench/host_breakdown.py --build "$build" --out "$RESULTS" || status=1
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 bench/profile_torch_call.py 2>&1 \
    | grep -E "^---|tottime|[0-9] +[0-9.]+ +[0-9.]+" | head -40
fi
if part fp8bench; then
  echo "== benchmark: FP8 (E4M3) beside BF16 on the same inputs, head dim 128 (fusedattn bench)"
  # FP8_BENCH_SHAPES (one shape per line) replaces the benchmark's five shapes, for experiments;
  # FP8_BENCH_ARGS goes to each bench call (--autotune: cuDNN's every candidate plan timed).
  shapes=${FP8_BENCH_SHAPES:-"b=2 s=8192 h=16 d=128
b=2 s=8192 h=16 d=128 causal
b=8 s=2048 h=32 d=128 causal
b=1 s=32768 h_q=32 h_kv=8 d=128 causal
b=1 s=8192 h_q=64 h_kv=8 d=128 causal"}
  : >"$RESULTS/bench-fp8.txt"  # one file a run
  while IFS= read -r shape; do
    # shellcheck disable=SC2086  # FP8_BENCH_ARGS is a list of arguments (--autotune)
    "$build/fusedattn" bench "layout=bshd dtype=e4m3 $shape" --iters 20 ${FP8_BENCH_ARGS:-} \
      | grep -v "^fusedattn\|^cuDNN\|^CUDA\|^GPU" | tee -a "$RESULTS/bench-fp8.txt" || status=1
  done <<<"$shapes"
  if [ -z "${FP8_BENCH_SHAPES:-}" ]; then
    echo "-- the grouped-heads shape with its FP8 backward kept grouped (FUSEDATTN_KV_EXPANSION=0), beside the above"
    FUSEDATTN_KV_EXPANSION=0 "$build/fusedattn" bench "layout=bshd dtype=e4m3 b=1 s=8192 h_q=64 h_kv=8 d=128 causal" \
      --iters 20 | grep -v "^fusedattn\|^cuDNN\|^CUDA\|^GPU" | tee -a "$RESULTS/bench-fp8.txt" || status=1
  fi
fi
if part fp8api; then
  echo "== benchmark: FP8 beside BF16 through the public API, PyTorch and JAX (bench/run_bench_fp8_api.py)"
  # shellcheck disable=SC2086  # FP8API_ARGS is a list of arguments (--shapes, --no-jax, --no-profile)
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 -X faulthandler bench/run_bench_fp8_api.py --build "$build" \
    --out "$RESULTS" ${FP8API_ARGS:-} || status=1
fi
if part flexbench; then
  echo "== benchmark: fusedattn.torch.flex_attention beside compiled FlexAttention (bench/run_bench_flex.py)"
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 -X faulthandler bench/run_bench_flex.py --build "$build" \
    --out "$RESULTS" || status=1
fi

if part flexcompat; then
  echo "== FlexAttention compatibility: its users' score_mods and mask_mods through flex_attention"
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 -X faulthandler bench/flex_compatibility.py --build "$build" \
    --out "$RESULTS" || status=1
fi

if part transformersbench; then
  echo "== benchmark: transformers models with fusedattn beside their own sdpa (bench/run_bench_transformers.py)"
  # TRANSFORMERS_BENCH_ARGS narrows it (--parts train|generate, --models llama|gemma2): the compiled
  # training steps alone take minutes of compiling.
  # shellcheck disable=SC2086  # TRANSFORMERS_BENCH_ARGS is a list of arguments
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 -X faulthandler bench/run_bench_transformers.py \
    --build "$build" --out "$RESULTS" ${TRANSFORMERS_BENCH_ARGS:-} || status=1
fi

if part modbench; then
  echo "== benchmark: a softcap score modifier beside plain attention, same shapes (fusedattn bench)"
  # MODBENCH_SHAPES (one spec per line, without the modifier) replaces the default shapes.
  shapes=${MODBENCH_SHAPES:-"layout=bshd b=2 s=8192 h=16 d=128 causal
layout=bshd b=2 s=8192 h=16 d=128"}
  : >"$RESULTS/bench-score-mod-cli.txt"  # one file a run
  while IFS= read -r shape; do
    for mod in "" " score_mod=mul(tanh(div(score,\$0)),\$0)"; do
      "$build/fusedattn" bench "$shape$mod" --iters 20 | grep -v "^fusedattn\|^cuDNN\|^CUDA\|^GPU" \
        | tee -a "$RESULTS/bench-score-mod-cli.txt" || status=1
    done
  done <<<"$shapes"
  echo "-- the same softcap through fusedattn.torch beside compiled FlexAttention (bench/run_bench_score_mod.py)"
  # shellcheck disable=SC2086  # MODBENCH_ARGS is a list of arguments (--causal-only)
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 -X faulthandler bench/run_bench_score_mod.py --build "$build" \
    --out "$RESULTS" ${MODBENCH_ARGS:-} || status=1
fi
if part plans; then
  echo "== plans: cold builds against restores from the disk cache, in new processes (bench/run_bench_plans.py)"
  python3 bench/run_bench_plans.py --build "$build" --out "$RESULTS" --log "$OUT/bench-plans.log" || status=1
fi
if part kernels; then
  echo "== kernels of a training step: fusedattn.torch beside PyTorch's cuDNN backend"
  # KERNEL_SHAPES (b,s,h_q[/h_kv],d[,causal] ...) replaces the default shapes.
  # shellcheck disable=SC2086  # KERNEL_SHAPES is a list of shapes
  CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE="$OUT/frontend_log.txt" FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" \
    python3 -X faulthandler bench/profile_backward_kernels.py ${KERNEL_SHAPES:+--shapes $KERNEL_SHAPES} \
    | tee "$OUT/kernels.txt" || status=1
  gzip -f "$OUT/frontend_log.txt" 2>/dev/null || true
fi
if part decode; then
  echo "== benchmark: decode through fusedattn.torch, on the decode kernel and on cuDNN, beside PyTorch"
  python3 -X faulthandler bench/run_bench_decode.py --build "$build" --out "$RESULTS" || status=1
fi
if part varlen; then
  echo "== benchmark: ragged training step and paged decode"
  # shellcheck disable=SC2086  # VARLEN_ARGS is a list of arguments (--no-step: the decode rows only)
  python3 -X faulthandler bench/run_bench_varlen.py --build "$build" --out "$RESULTS" ${VARLEN_ARGS:-} || status=1
fi
if part decodeprof; then
  echo "== diagnostic: a split decode's kernels, their timeline and the calls by chunk count"
  # shellcheck disable=SC2086  # DECODEPROF_ARGS is a list of arguments (--no-sweep, --cudnn-sweep)
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 -X faulthandler bench/profile_decode_kernels.py ${DECODEPROF_ARGS:-} \
    | tee "$OUT/decode_kernels.txt" || status=1
fi
if part jaxbench; then
  echo "== benchmark: fusedattn.jax against jax.nn.dot_product_attention"
  XLA_PYTHON_CLIENT_PREALLOCATE=false FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" \
    python3 -X faulthandler bench/run_bench_jax.py --out "$RESULTS" || status=1
fi

if part sanitizer; then
  # compute-sanitizer over a part of the GPU tier: memcheck (out-of-bounds and misaligned accesses,
  # leaks) and racecheck (shared-memory races), each through its own kernels and cuDNN's.
  echo "== compute-sanitizer"
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$sanitizer" ]; then
    echo "compute-sanitizer: not found"
    status=1
  else
    # The default memcheck filter passes through each of fusedattn's own kernels at least once: the
    # ragged offsets and padding fills (Execution, Ragged), the dropout offset (Replay), the split
    # decode's prepare and merge kernels, FP8 scaling and quantization, MXFP8 quantization, the max
    # logit's rows and heads, the K/V expansion of a grouped FP8 backward (gqa_16_4), and the
    # allocators' fault paths.
    default_memcheck='Execution.*:Ragged.*:Replay.*:PagedSplitDecode.*:Fp8ScalingGpu.*:GpuMxfp8.*'
    default_memcheck+=':*Numerics*max_logit*:*Fp8Numerics*gqa_16_4*:Faults.AFailing*'
    for tool in memcheck racecheck; do
      if [ "$tool" = memcheck ]; then filter=${MEMCHECK_FILTER:-$default_memcheck}
      else filter=${RACECHECK_FILTER:-PagedSplitDecode.*}; fi
      echo "-- $tool: $filter"
      "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 50 \
        "$build/tests/fusedattn_gpu_tests" --gtest_filter="$filter" >"$OUT/sanitizer_$tool.txt" 2>&1
      rc=$?
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$OUT/sanitizer_$tool.txt" | tail -8
      if [ "$tool" = racecheck ] && [ $rc -eq 99 ] && grep -q "Race reported" "$OUT/sanitizer_$tool.txt" &&
         ! grep -A1 "Race reported" "$OUT/sanitizer_$tool.txt" | grep -E "access at " | grep -vq "cudnn_generated_"; then
        # Every hazard is inside cuDNN's generated kernels (Hopper kernels order their shared memory
        # with asynchronous barriers, which racecheck does not model): reported, not fusedattn's.
        echo "racecheck: every hazard is inside cuDNN's own kernels, none in fusedattn's:"
        grep -A1 "Race reported" "$OUT/sanitizer_$tool.txt" | grep -oE "cudnn_generated_[A-Za-z0-9_]+" | sort -u
        rc=0
      fi
      [ $rc -eq 0 ] || { echo "$tool: exit $rc"; status=1; }
    done
  fi
fi

if part tsan; then
  # ThreadSanitizer over the threads test on the GPU: the library and the GPU tests built with
  # -fsanitize=thread in a folder of their own (the CUDA sources as they are), then 16 threads of
  # TSAN_THREADS_CALLS mixed calls each (every host memory access is checked, so fewer than the
  # plain run's 10,000), and the execution tests beside. Any report fails the run.
  echo "== ThreadSanitizer: the threads and execution tests on the GPU"
  tsan_build=build-gpu-tsan
  mkdir -p "$tsan_build"
  if cmake -S . -B "$tsan_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 \
       -DFUSEDATTN_PYTHON=OFF -DFUSEDATTN_SANITIZE=thread >"$tsan_build/cmake.txt" 2>&1 &&
     ninja -C "$tsan_build" -j"$(nproc)" fusedattn_gpu_tests >"$tsan_build/ninja.txt" 2>&1; then
    # libcudnn.so.9 dlopens its sub-libraries (graph, engines) by name; ThreadSanitizer intercepts
    # dlopen, so the search no longer starts from libcudnn.so.9's own folder, and the first run
    # (2026-12-02) loaded the system's cuDNN 9.14 beside the package's 9.19 ("compiled 9.19.0,
    # loaded 9.14.0"). The library's folder goes first on the path for this binary.
    cudnn_lib=$(sed -n 's/.*fusedattn: cuDNN [0-9.]*: [^,]*, \(.*\)\/libcudnn[^/]*$/\1/p' "$tsan_build/cmake.txt")
    LD_LIBRARY_PATH="$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
      FUSEDATTN_THREADS_CALLS=${TSAN_THREADS_CALLS:-500} "$tsan_build/tests/fusedattn_gpu_tests" \
      --gtest_filter="${TSAN_FILTER:-Threads*:Execution.*}" >"$OUT/tsan.txt" 2>&1
    rc=$?
    grep -E "cuDNN compiled|threads:|WARNING: ThreadSanitizer|SUMMARY|FATAL|tests ran|PASSED|FAILED" "$OUT/tsan.txt" | head -20
    [ $rc -eq 0 ] || { echo "tsan: exit $rc"; status=1; }
  else
    tail -30 "$tsan_build/cmake.txt" "$tsan_build/ninja.txt"
    status=1
  fi
fi

if [ ${#xmls[@]} -gt 0 ]; then
  echo "== results"
  python3 scripts/gpu_results.py --xml "${xmls[@]}" --info-bin "$build/fusedattn" --out "$OUT/gpu_results.md" \
    || status=1
fi
# The device returns only a handful of files: the tests' raw outputs travel as one archive
# (tests.tar.gz: the XML reports, each pytest tier's full output, test.sh's log, the cudnn part's logs).
raw=$(cd "$OUT" && ls gpu_tests*.xml gpu_tests*.txt python_*.xml python_*.txt test_sh.txt cudnn-*.txt sanitizer_*.txt tsan.txt 2>/dev/null)
if [ -n "$raw" ]; then
  # shellcheck disable=SC2086  # a list of file names without spaces
  (cd "$OUT" && tar czf tests.tar.gz $raw && rm -f $raw)
fi
exit $status
