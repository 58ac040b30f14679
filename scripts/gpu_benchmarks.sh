# Sourced by scripts/gpu_run.sh (not run alone): its benchmark parts, each writing its files into
# $RESULTS under the names they have in the tree's results/. Uses gpu_run.sh's part(), $build, $OUT,
# $RESULTS and status.
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
  echo "== diagnostic: decode calls' kernels and timelines (paged, contiguous, PyTorch dense), by path"
  # shellcheck disable=SC2086  # DECODEPROF_ARGS is a list of arguments (--paths kernel cudnn, --no-sweep, --points)
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 -X faulthandler bench/profile_decode_kernels.py ${DECODEPROF_ARGS:-} \
    | tee "$OUT/decode_kernels.txt" || status=1
fi
if part decodencu; then
  echo "== diagnostic: Nsight Compute over one decode call's kernels (time, DRAM, warps and their stalls)"
  # shellcheck disable=SC2086  # DECODENCU_ARGS is a list of arguments (--points 1,8192, --cuts 16 32)
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 bench/ncu_decode.py ${DECODENCU_ARGS:-} \
    | tee "$OUT/decode_ncu.txt" || status=1
fi
if part flexprof; then
  echo "== diagnostic: flex_attention training steps, host time and kernels, replay on and off"
  # shellcheck disable=SC2086  # FLEXPROF_REPLAY is a list of FUSEDATTN_REPLAY settings to run under
  for replay in ${FLEXPROF_REPLAY:-1 0}; do
    FUSEDATTN_REPLAY=$replay FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 bench/profile_flex_step.py \
      --build "$build" --cases "${FLEXPROF_CASES:-causal;prefix-LM 256;32 documents, causal}" \
      >"$OUT/flex_step_profile_replay$replay.txt" 2>&1 || status=1
    grep -E "^## " "$OUT/flex_step_profile_replay$replay.txt" | sed "s/^/replay $replay: /" || true
  done
fi

if part transformersprof; then
  echo "== diagnostic: a transformers model's decode steps, fusedattn beside sdpa (host functions, GPU kernels)"
  # shellcheck disable=SC2086  # TRANSFORMERSPROF_ARGS is a list of arguments (--model, --batch, --prompt)
  FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" python3 bench/profile_transformers_decode.py --build "$build" \
    ${TRANSFORMERSPROF_ARGS:-} >"$OUT/transformers_decode_profile.txt" 2>&1 || status=1
  grep -E "^## " "$OUT/transformers_decode_profile.txt" || true
fi
if part jaxbench; then
  echo "== benchmark: fusedattn.jax against jax.nn.dot_product_attention"
  XLA_PYTHON_CLIENT_PREALLOCATE=false FUSEDATTN_PYTHON_BUILD="$PWD/$build/python" \
    python3 -X faulthandler bench/run_bench_jax.py --out "$RESULTS" || status=1
fi
