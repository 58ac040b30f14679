// tools/bench.h — the timings of one spec that `fusedattn bench` prints and the demo quotes.
#pragma once

#include <string>

#include "progress.h"
#include "fusedattn/attention.h"
#include "fusedattn/plan_cache.h"

namespace fusedattn::cli {

struct BenchResult {
  double build_forward_ms = 0.0, build_backward_ms = 0.0;
  double restore_forward_ms = -1.0, restore_backward_ms = -1.0;  // from the disk cache; < 0: off
  double forward_ms = 0.0, forward_backward_ms = 0.0, backward_ms = 0.0;
  double host_us_per_call = 0.0;
  CacheStats cache;
  std::string backward_refused;  // the reasons, where the backward is not supported (forward timed alone)
};

/// The steps of run_bench, each one a Progress item.
constexpr int kBenchSteps = 5;

/// Times `spec`: plan builds and disk restores, each pass's kernels (median of `iters` calls) and
/// the host time of a cached call. `fwd` and `bwd` are the tensors of `spec` with statistics (the
/// training forward's). `progress` (may be null) advances by kBenchSteps.
BenchResult run_bench(const AttentionSpec& spec, int iters, const ForwardTensors& fwd, const BackwardTensors& bwd,
                      Progress* progress);

}  // namespace fusedattn::cli
