# Sourced by scripts/gpu_run.sh (not run alone): its checking parts beyond the tiers, the GPU tiers
# under other cuDNN versions (cudnn), the soak alone (soak), compute-sanitizer (sanitizer) and
# ThreadSanitizer (tsan). Uses gpu_run.sh's part(), $build, $OUT, $RESULTS and status.

# The LD_LIBRARY_PATH that loads the cuDNN of folder $1 (from scripts/cudnn_libs.sh, unpacked here
# the first time) in place of the pinned one; "pinned" keeps the path as it is. Fails where the
# folder's parts do not unpack.
cudnn_library_path() {
  if [ "$1" = pinned ]; then echo "${LD_LIBRARY_PATH:-}"; return; fi
  [ -d "$1/lib" ] || bash scripts/cudnn_libs.sh unpack "$1" >&2 || return 1
  echo "$(cd "$1/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

if part cudnn; then
  # The GPU tiers (C++ and Python, through the README build's ctest) again under each other cuDNN in
  # CUDNN_ALT: folders that scripts/cudnn_libs.sh packs from a nvidia-cudnn-cu13 wheel and unpacks
  # here. The library stays built against the pinned headers and loads the other through
  # LD_LIBRARY_PATH, as it does beside a PyTorch that brings a newer cuDNN. One results file per
  # version: $RESULTS/gpu-results-cudnn-<version>.md.
  for dir in ${CUDNN_ALT:-}; do
    alt_path=$(cudnn_library_path "$dir") || { status=1; continue; }
    version=$(basename "$dir")
    echo "== GPU tiers with cuDNN $version ($dir/lib)"
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

if part soak; then
  # The soak alone (SerialSoak: every spec of its space once, then random draws through a plan cache
  # capped at 64), long: SOAK_SPECS draws (10,000 by default) under each cuDNN of SOAK_CUDNN ("pinned"
  # for the one built against, or folders as in CUDNN_ALT; default: pinned and CUDNN_ALT's). Its host
  # memory by tenths of the draws shows growth held per build or per call.
  for dir in ${SOAK_CUDNN:-pinned ${CUDNN_ALT:-}}; do
    alt_path=$(cudnn_library_path "$dir") || { status=1; continue; }
    name=$(basename "$dir")
    echo "== soak, ${SOAK_SPECS:-10000} specs, cuDNN $name"
    started=$SECONDS
    LD_LIBRARY_PATH=$alt_path FUSEDATTN_SOAK_SPECS=${SOAK_SPECS:-10000} "$build/tests/fusedattn_gpu_tests" \
      --gtest_filter='SerialSoak.*' >"$OUT/soak-$name.txt" 2>&1 || status=1
    grep -E "cuDNN|soak:|Failure|Expected|Which is|tests ran|PASSED|FAILED" "$OUT/soak-$name.txt" | head -20
    echo "soak under cuDNN $name: $((SECONDS - started)) s"
  done
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
