// fusedattn/warmup.h — building plans ahead of time, in parallel, into the caches.
//
//   auto specs = fusedattn::ragged_buckets(fusedattn::parse_spec("layout=thd_thd_thd b=64 s=4096 h=16 d=128 causal"));
//   for (const auto& r : fusedattn::warm_up(specs, {fusedattn::Pass::forward, fusedattn::Pass::backward}))
//     if (!r.ok) std::cerr << r.message << "\n";
//
// Each plan lands in the process's plan cache and in the disk cache (fusedattn/disk_cache.h), so
// later processes on the machine start with them. `fusedattn warmup` does the same from the shell.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "fusedattn/autotune.h"
#include "fusedattn/ragged.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn {

struct WarmupOptions {
  int threads = 0;  ///< build threads; 0: the hardware's, at most 8
  PlanOptions plan;  ///< autotune or not (the timings run one at a time even so)
  /// Called after each plan with the count done so far and the total, from the build threads but
  /// one call at a time, so that a long warm-up can show it is moving (the CLI's progress lines).
  /// Must not throw. Empty: nothing is called.
  std::function<void(std::size_t done, std::size_t total)> progress;
};

/// One spec and pass of a warm-up.
struct WarmupResult {
  AttentionSpec spec;
  Pass pass = Pass::forward;
  bool ok = false;      ///< a plan is ready
  std::string message;  ///< when not ok: every reason it is not supported, or the error
  double ms = 0.0;      ///< time to have the plan (restored from disk, built, or tuned)
};

/// Gets the plan of every spec for every pass, `options.threads` at a time, on the current device.
/// Never throws for one spec: its result says what went wrong (a bad spec included).
std::vector<WarmupResult> warm_up(const std::vector<AttentionSpec>& specs, const std::vector<Pass>& passes,
                                  const WarmupOptions& options = {});

}  // namespace fusedattn
