// The one process-wide plan cache (keys: plan_key.cpp; the LRU: fusedattn/lru_cache.h): configuration
// from the environment (read once), the debug event log, and the builder that turns a key into a
// support answer and a compiled plan. Every adapter reaches plans through it alone.
#include "cache/plan_store.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "cache/disk_cache.h"
#include "exec/autotune.h"
#include "exec/decode_kernel.h"
#include "exec/decode_split.h"
#include "exec/device.h"
#include "exec/environment_switch.h"
#include "exec/kv_expansion.h"
#include "exec/relaxed_capture.h"
#include "fusedattn/build_info.h"
#include "fusedattn/disk_cache.h"
#include "fusedattn/errors.h"
#include "graph/sdpa_graph.h"
#include "spec/naming_errors.h"

#ifndef FUSEDATTN_VERSION
#define FUSEDATTN_VERSION "unknown"
#endif

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

std::atomic<bool> g_logging{false};  // mirrors whether the cache has its listener

void write_log_line(const std::string& line) {
  LogState& state = log_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.sink) {
    state.sink(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());  // only when the user asked for the log
  }
}

// The disk cache's and autotune's events, in the same log as the cache's: "fusedattn: <what> <key>".
void log_line(const std::string& what, const PlanKey& key) {
  if (g_logging.load(std::memory_order_relaxed)) write_log_line("fusedattn: " + what + " " + to_string(key));
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

bool logging_requested_by_environment() { return detail::switch_on_when_set("FUSEDATTN_LOG"); }

PlanCache& plan_cache() {
  // Built on first use; FUSEDATTN_PLAN_CACHE_CAP and FUSEDATTN_LOG are read here and never again.
  static PlanCache* cache = [] {
    const char* cap = std::getenv("FUSEDATTN_PLAN_CACHE_CAP");
    auto* created = new PlanCache(cap ? parse_cache_capacity(cap, "FUSEDATTN_PLAN_CACHE_CAP") : kDefaultPlanCacheCapacity);
    if (logging_requested_by_environment()) {
      created->set_listener(log_event);
      g_logging = true;
    }
    return created;  // never destroyed: plans may be used from static destructors of callers
  }();
  return *cache;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The disk cache's key of a plan: everything that makes it valid, on one line. The device ordinal
// is left out (a plan serves any device of the same model), the GPU's model, SM count and driver
// and this build of the graph layer are in.
std::string disk_key(const PlanKey& key) {
  return std::string("fusedattn=") + FUSEDATTN_VERSION + " graph=" + graph::build_stamp() + " " +
         detail::device_fingerprint(key.device) + " sm=" + std::to_string(key.sm) + " cudnn=" +
         std::to_string(key.cudnn_runtime) + " fe=" + std::to_string(key.frontend) + " " + to_string(key.pass) +
         (key.tuned ? " tuned " : " ") + to_string(key.spec);
}

// The plan from the disk cache, or null (missing, off, or unusable: then counted, logged, and
// deleted, to be rewritten after the build).
std::shared_ptr<const graph::CompiledGraph> restored(const std::string& disk, const PlanKey& key, cudnnHandle_t handle) {
  const auto start = std::chrono::steady_clock::now();
  detail::DiskLookup lookup = detail::disk_lookup(disk);
  if (lookup.check == detail::PlanFileCheck::missing) return nullptr;
  if (lookup.check != detail::PlanFileCheck::loaded) {
    log_line(std::string("disk_reject ") + detail::to_string(lookup.check), key);
    return nullptr;
  }
  const double read_ms = ms_since(start);
  graph::LoadOutcome loaded = graph::load_graph(lookup.payload, handle);
  if (!loaded.graph) {
    detail::note_unusable(lookup);
    log_line("disk_reject " + loaded.error, key);
    return nullptr;
  }
  const double ms = ms_since(start);
  detail::note_loaded(ms);
  char text[128];
  std::snprintf(text, sizeof text, "disk_load %.1f ms (read %.2f, parse %.2f, finalize %.2f ms; %zu KB)", ms, read_ms,
                loaded.parse_ms, loaded.finalize_ms, lookup.payload.size() / 1024);
  log_line(text, key);
  return loaded.graph;
}

// Built now: the heuristics' first choice, or with autotune the fastest candidate.
graph::BuildOutcome built(const AttentionSpec& spec, const PlanKey& key, cudnnHandle_t handle) {
  if (!key.tuned) return graph::build_graph(spec, key.pass, handle);
  graph::CandidatesOutcome candidates = graph::build_candidates(spec, key.pass, handle);
  if (!candidates.candidates) return graph::BuildOutcome{nullptr, std::move(candidates.rejections)};
  detail::Tuning tuning = detail::autotune(*candidates.candidates, spec, key.device);
  log_line(detail::to_string(tuning), key);
  return graph::BuildOutcome{std::move(tuning.graph), {}};
}

void store(const std::string& disk, const PlanKey& key, const graph::CompiledGraph& graph) {
  if (plan_dir().empty()) return;
  const std::vector<std::uint8_t> bytes = graph.serialize();
  if (bytes.empty()) {
    log_line("disk_skip (cuDNN cannot serialize this plan)", key);
    return;
  }
  const std::string error = detail::disk_store(disk, bytes);
  log_line(error.empty() ? "disk_store" : "disk_store_failed " + error, key);
}

std::shared_ptr<const detail::CacheEntry> build_spec_entry(const PlanKey& key) {
  auto entry = std::make_shared<detail::CacheEntry>();
  entry->support = check_support_policy(key.spec, key.pass, DeviceCaps{key.sm / 10, key.sm % 10},
                                        detail::versions());
  if (!entry->support.ok()) return entry;
  // fusedattn's own decode kernel where the rule picks it (an FP8 K/V cache always: the policy
  // refused it where the kernel does not take it); no cuDNN graph then.
  if (const auto shape = detail::decode_kernel_in_use(key.spec, key.pass, key.device)) {
    entry->plan = std::make_shared<Plan>(key.spec, key.pass, key.device, nullptr);
    entry->support.kernel = detail::decode_kernel_description(*shape);
    return entry;
  }
  const detail::DecodeSplit split = detail::decode_split_in_use(key.spec, key.pass, key.device);
  if (split.split() && check_support(detail::decode_chunks_spec(key.spec, split), key.pass).ok() &&
      (!detail::has_masked_call(split) || check_support(detail::decode_masked_spec(key.spec, split), key.pass).ok())) {
    // The chunks' plans are cached under their own specs; where cuDNN refuses one, one call.
    entry->plan = std::make_shared<Plan>(key.spec, key.pass, key.device, nullptr);
    entry->support.kernel = "cuDNN split decode, " + std::to_string(split.chunks) + " chunks of " +
                            std::to_string(split.chunk_pages) + " pages" +
                            (detail::has_masked_call(split) ? " and a masked call" : "");
    return entry;
  }
  cudnnHandle_t handle = detail::handle_for(key.device, nullptr);
  const std::string disk = disk_key(key);
  std::shared_ptr<const graph::CompiledGraph> graph = restored(disk, key, handle);
  if (!graph) {
    const bool ungrouped = detail::expands_kv_heads_on(key.spec, key.pass, key.device);
    graph::BuildOutcome outcome = built(ungrouped ? detail::kv_expanded_spec(key.spec) : key.spec, key, handle);
    if (!outcome.graph) {
      entry->support.reasons = std::move(outcome.rejections);
      return entry;
    }
    graph = std::move(outcome.graph);
    store(disk, key, *graph);
  }
  entry->plan = std::make_shared<Plan>(key.spec, key.pass, key.device, std::move(graph));
  entry->support.kernel = "cuDNN";
  return entry;
}

// The builder the cache calls. Builds run in relaxed capture mode (exec/relaxed_capture.h); a
// failure leaves nothing in the cache (fusedattn/lru_cache.h) and its error names the spec.
std::shared_ptr<const detail::CacheEntry> build_entry(const PlanKey& key) {
  detail::RelaxedCapture relaxed;
  return detail::naming_the_call(key.pass, key.spec, [&] { return build_spec_entry(key); });
}

}  // namespace

namespace detail {

std::shared_ptr<const CacheEntry> find_or_build(const AttentionSpec& spec, Pass pass, const PlanOptions& options) {
  int device = current_device();
  const Versions& v = versions();
  static const bool versions_checked = (require_matching_cudnn(), true);
  (void)versions_checked;
  PlanKey key = make_plan_key(spec, pass, device, device_caps(device), v);
  key.tuned = options.autotune == Autotune::on || (options.autotune == Autotune::process_default && autotune_default());
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
  g_logging = enabled;
}

}  // namespace fusedattn
