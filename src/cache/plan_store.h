// Internal: the process-wide plan cache and the entry it holds for each key.
#pragma once

#include <memory>

#include "fusedattn/attention.h"
#include "fusedattn/autotune.h"
#include "fusedattn/plan_cache.h"

namespace fusedattn::detail {

/// What the cache keeps per key: the support answer and, when supported, the compiled plan.
struct CacheEntry {
  Support support;
  std::shared_ptr<const Plan> plan;
};

/// The entry for `spec` and `pass` on the current device: from memory, else from the disk cache
/// (fusedattn/disk_cache.h), else built (and tuned, with options.autotune) and written there.
/// Checks cuDNN's versions (SetupError). `spec` must be valid: the public entries (get_plan,
/// check_support, warm_up) validate it, once a call, or take a ValidatedSpec; this does not again.
std::shared_ptr<const CacheEntry> find_or_build(const AttentionSpec& spec, Pass pass, const PlanOptions& options = {});

}  // namespace fusedattn::detail
