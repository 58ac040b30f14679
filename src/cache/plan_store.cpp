// The one process-wide plan cache (keys: plan_key.cpp; the LRU: fusedattn/lru_cache.h): configuration
// from the environment (read once), the debug event log, and the builder that turns a key into a
// support answer and a compiled plan. Every adapter reaches plans through it alone.
#include "cache/plan_store.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "exec/causal_composite.h"
#include "exec/device.h"
#include "exec/kv_expansion.h"
#include "fusedattn/build_info.h"
#include "fusedattn/errors.h"
#include "graph/sdpa_graph.h"

namespace fusedattn {
namespace {

using PlanCache = LruCache<PlanKey, detail::CacheEntry, PlanKeyHash>;

struct LogState {
  std::mutex mutex;
  std::function<void(const std::string&)> sink;
};

LogState& log_state() {
  static LogState state;
  return state;
}

void write_log_line(const std::string& line) {
  LogState& state = log_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.sink) {
    state.sink(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());  // only when the user asked for the log
  }
}

void log_event(CacheEvent event, const PlanKey& key, double ms) {
  std::string line = std::string("fusedattn: ") + to_string(event);
  if (event == CacheEvent::build || event == CacheEvent::build_failed) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, " %.1f ms", ms);
    line += buffer;
  }
  write_log_line(line + " " + to_string(key));
}

bool logging_requested_by_environment() {
  const char* value = std::getenv("FUSEDATTN_LOG");
  return value && *value && std::string(value) != "0";
}

PlanCache& plan_cache() {
  // Built on first use; FUSEDATTN_PLAN_CACHE_CAP and FUSEDATTN_LOG are read here and never again.
  static PlanCache* cache = [] {
    const char* cap = std::getenv("FUSEDATTN_PLAN_CACHE_CAP");
    auto* created = new PlanCache(cap ? parse_cache_capacity(cap, "FUSEDATTN_PLAN_CACHE_CAP") : kDefaultPlanCacheCapacity);
    if (logging_requested_by_environment()) created->set_listener(log_event);
    return created;  // never destroyed: plans may be used from static destructors of callers
  }();
  return *cache;
}

std::shared_ptr<const detail::CacheEntry> build_entry(const PlanKey& key) {
  auto entry = std::make_shared<detail::CacheEntry>();
  entry->support = check_support_policy(key.spec, key.pass, DeviceCaps{key.sm / 10, key.sm % 10},
                                        detail::versions());
  if (!entry->support.ok()) return entry;
  const detail::CausalBlocks blocks = detail::causal_blocks_in_use(key.spec);
  if (blocks.split()) {
    // Each block's plan and answer are cached under its own spec; the first refusal is the answer.
    const std::int64_t count = key.pass == Pass::forward ? blocks.count : detail::backward_count(key.spec, blocks);
    for (std::int64_t i = 0; i < count; ++i) {
      const AttentionSpec block = key.pass == Pass::forward ? detail::forward_block(key.spec, blocks, i)
                                                           : detail::backward_block(key.spec, blocks, i);
      Support answer = check_support(block, key.pass);
      if (!answer.ok()) {
        entry->support = std::move(answer);
        return entry;
      }
    }
    entry->plan = std::make_shared<Plan>(key.spec, key.pass, key.device, nullptr);  // the blocks' plans
    return entry;
  }
  cudnnHandle_t handle = detail::handle_for(key.device, nullptr);
  const bool ungrouped = detail::expands_kv_heads_on(key.spec, key.pass, key.device);
  graph::BuildOutcome outcome =
      graph::build_graph(ungrouped ? detail::kv_expanded_spec(key.spec) : key.spec, key.pass, handle);
  if (!outcome.graph) {
    entry->support.reasons = std::move(outcome.rejections);
    return entry;
  }
  entry->plan = std::make_shared<Plan>(key.spec, key.pass, key.device, std::move(outcome.graph));
  return entry;
}

}  // namespace

namespace detail {

std::shared_ptr<const CacheEntry> find_or_build(const AttentionSpec& spec, Pass pass) {
  validate(spec);
  int device = current_device();
  const Versions& v = versions();
  static const bool versions_checked = (require_matching_cudnn(), true);
  (void)versions_checked;
  PlanKey key = make_plan_key(spec, pass, device, device_caps(device), v);
  return plan_cache().get_or_build(key, build_entry);
}

}  // namespace detail

CacheStats plan_cache_stats() { return plan_cache().stats(); }
void clear_plan_cache() { plan_cache().clear(); }
void set_plan_cache_capacity(std::size_t capacity) { plan_cache().set_capacity(capacity); }

void set_log_sink(std::function<void(const std::string&)> sink) {
  LogState& state = log_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.sink = std::move(sink);
}

void set_logging(bool enabled) {
  plan_cache().set_listener(enabled ? PlanCache::Listener(log_event) : PlanCache::Listener());
}

}  // namespace fusedattn
