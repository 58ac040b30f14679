// fusedattn/plan_cache.h — the one process-wide cache of compiled plans and support answers.
//
// Key = normalized spec + pass + device ordinal + SM version + cuDNN runtime version + frontend
// version. Lookup compares whole keys; the hash only picks the bucket. The value is either a
// compiled plan or cuDNN's "not supported" answer, so asking twice never rebuilds either.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "fusedattn/lru_cache.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn {

/// Everything a compiled plan depends on. Fields the builder reads must all be here.
struct PlanKey {
  Pass pass = Pass::forward;
  AttentionSpec spec;  ///< normalized: fields the pass ignores are reset (see make_plan_key)
  int device = 0;
  int sm = 0;
  int cudnn_runtime = 0;
  int frontend = 0;
  bool tuned = false;  ///< the plan autotune chose (PlanOptions), kept apart from the heuristics' choice

  friend bool operator==(const PlanKey& a, const PlanKey& b) noexcept {
    return a.pass == b.pass && a.spec == b.spec && a.device == b.device && a.sm == b.sm &&
           a.cudnn_runtime == b.cudnn_runtime && a.frontend == b.frontend && a.tuned == b.tuned;
  }
  friend bool operator!=(const PlanKey& a, const PlanKey& b) noexcept { return !(a == b); }
};

/// Normalizes `spec` for `pass` (the backward pass always consumes statistics, so `stats` does
/// not split backward entries) and fills in the device and versions.
PlanKey make_plan_key(const AttentionSpec& spec, Pass pass, int device, const DeviceCaps& caps, const Versions& versions);

/// "forward device=0 sm=90 cudnn=91900 fe=13200 <spec string>" ("forward tuned device=0 ..." for
/// an autotuned plan): the form the debug log prints.
std::string to_string(const PlanKey& key);

struct PlanKeyHash {
  std::size_t operator()(const PlanKey& key) const noexcept;
};

/// Default capacity of the plan cache; FUSEDATTN_PLAN_CACHE_CAP overrides it (read once).
constexpr std::size_t kDefaultPlanCacheCapacity = 512;

/// Parses a capacity setting: a positive integer, or InvalidArgument naming `variable`.
std::size_t parse_cache_capacity(const char* text, const char* variable);

/// Counters of the process-wide plan cache.
CacheStats plan_cache_stats();
/// Plans alive in the process: those in the cache and those a caller still holds. With no caller
/// holding plans (the adapters hold none), it stays within the cache's capacity.
std::size_t live_plans() noexcept;
/// Drops every cached plan and answer and zeroes the counters (tests and benchmarks use this).
void clear_plan_cache();
/// Changes the capacity at run time (evicting at once if needed).
void set_plan_cache_capacity(std::size_t capacity);

/// The debug event log is on when FUSEDATTN_LOG is set to a non-empty value other than "0"
/// (read once, at the first cache use). Each event is one line: "fusedattn: <event> [<ms>] <key>".
/// A sink replaces the default (standard error); an empty function restores it.
void set_log_sink(std::function<void(const std::string&)> sink);
/// Turns the event log on or off at run time, overriding FUSEDATTN_LOG.
void set_logging(bool enabled);

}  // namespace fusedattn
