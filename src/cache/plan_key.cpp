// Plan cache keys: normalization per pass, printing, hashing, and the capacity setting's parser.
#include <limits>
#include <string_view>

#include "fusedattn/errors.h"
#include "fusedattn/lru_cache.h"
#include "fusedattn/plan_cache.h"
#include "fusedattn/ragged.h"
#include "spec/diagonal.h"
#include "spec/fields.h"
#include "spec/text.h"

namespace fusedattn {

PlanKey make_plan_key(const AttentionSpec& spec, Pass pass, int device, const DeviceCaps& caps, const Versions& versions) {
  PlanKey key;
  key.pass = pass;
  // Ragged batches: one plan per bucket of batch size and longest sequence (fusedattn/ragged.h).
  key.spec = bucketed(spec);
  // Fields the pass's graph does not read (the field table in spec.cpp says which) are reset.
  detail::reset_unread_fields(key.spec, pass);
  // The alignment only places the window's diagonal: where two place it alike (no bound, or equal
  // fixed lengths) the graphs are identical, and the top-left one is built.
  key.spec.alignment = detail::placed_alignment(spec);
  key.device = device;
  key.sm = caps.sm();
  key.cudnn_runtime = versions.cudnn_runtime;
  key.frontend = versions.frontend;
  return key;
}

std::string to_string(const PlanKey& key) {
  return std::string(to_string(key.pass)) + (key.tuned ? " tuned" : "") + " device=" + std::to_string(key.device) + " sm=" + std::to_string(key.sm) +
         " cudnn=" + std::to_string(key.cudnn_runtime) + " fe=" + std::to_string(key.frontend) + " " + to_string(key.spec);
}

std::size_t PlanKeyHash::operator()(const PlanKey& key) const noexcept {
  std::size_t seed = hash_value(key.spec);
  detail::hash_combine(seed, static_cast<std::size_t>(key.pass));
  detail::hash_combine(seed, std::hash<int>{}(key.device));
  detail::hash_combine(seed, std::hash<int>{}(key.sm));
  detail::hash_combine(seed, std::hash<int>{}(key.cudnn_runtime));
  detail::hash_combine(seed, std::hash<int>{}(key.frontend));
  detail::hash_combine(seed, static_cast<std::size_t>(key.tuned));
  return seed;
}

std::size_t parse_cache_capacity(const char* text, const char* variable) {
  const std::string name = variable ? variable : "capacity";
  const std::string value = text ? text : "";
  auto parsed = detail::parse_int64(value);
  if (!parsed || *parsed <= 0) throw InvalidArgument(name, value, "a positive integer (the most plans the cache holds)");
  if (static_cast<std::uint64_t>(*parsed) > std::numeric_limits<std::size_t>::max()) {
    throw InvalidArgument(name, value, "a positive integer that fits in size_t");
  }
  return static_cast<std::size_t>(*parsed);
}

const char* to_string(CacheEvent event) noexcept {
  switch (event) {
    case CacheEvent::hit: return "hit";
    case CacheEvent::miss: return "miss";
    case CacheEvent::build: return "build";
    case CacheEvent::build_failed: return "build_failed";
    case CacheEvent::eviction: return "eviction";
  }
  return "unknown";
}

}  // namespace fusedattn
