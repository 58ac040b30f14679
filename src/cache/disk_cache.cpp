// The disk cache's folder setting (read once from the environment), its counters, and the
// lookups and writes the plan store makes through plan_file.h.
#include "cache/disk_cache.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>

#include "fusedattn/disk_cache.h"
#include "fusedattn/errors.h"
#include "spec/text.h"

namespace fusedattn {
namespace {

struct DiskState {
  std::mutex mutex;
  std::string folder;
  std::uint64_t cap_bytes = kDefaultPlanDirCapBytes;
  DiskCacheStats stats;
};

DiskState& state() {
  static DiskState* created = [] {
    auto* s = new DiskState;  // never destroyed: plans may be built from static destructors of callers
    s->folder = detail::plan_dir_from_setting(std::getenv("FUSEDATTN_PLAN_DIR"), std::getenv("XDG_CACHE_HOME"),
                                              std::getenv("HOME"));
    if (const char* cap = std::getenv("FUSEDATTN_PLAN_DIR_CAP_MB")) {
      s->cap_bytes = detail::parse_cap_megabytes(cap) << 20;
    }
    return s;
  }();
  return *created;
}

std::string absolute(const std::string& folder) {
  std::error_code error;
  std::filesystem::path path = std::filesystem::absolute(folder, error);
  return error ? folder : path.lexically_normal().string();
}

}  // namespace

namespace detail {

std::string plan_dir_from_setting(const char* value, const char* xdg_cache_home, const char* home) {
  if (value != nullptr) {
    const std::string setting = value;
    if (setting.empty() || setting == "off" || setting == "0") return "";
    return absolute(setting);
  }
  if (xdg_cache_home != nullptr && *xdg_cache_home == '/') return std::string(xdg_cache_home) + "/fusedattn/plans";
  if (home != nullptr && *home != '\0') return std::string(home) + "/.cache/fusedattn/plans";
  return "";
}

std::uint64_t parse_cap_megabytes(const char* text) {
  const std::string value = text ? text : "";
  auto parsed = parse_int64(value);
  if (!parsed || *parsed <= 0 || *parsed > (1ll << 40)) {
    throw InvalidArgument("FUSEDATTN_PLAN_DIR_CAP_MB", value, "a positive integer of megabytes (the folder's size cap)");
  }
  return static_cast<std::uint64_t>(*parsed);
}

DiskLookup disk_lookup(const std::string& key) {
  DiskLookup lookup;
  std::string folder = plan_dir();
  if (folder.empty()) return lookup;
  lookup.path = folder + "/" + plan_file_name(key);
  PlanFile file = read_plan_file(lookup.path, key);
  lookup.check = file.check;
  lookup.payload = std::move(file.payload);
  DiskState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (lookup.check == PlanFileCheck::missing) {
    ++s.stats.missing;
  } else if (lookup.check != PlanFileCheck::loaded) {
    ++s.stats.rejected;
  }
  return lookup;
}

void note_unusable(const DiskLookup& lookup) {
  std::error_code ignored;
  std::filesystem::remove(lookup.path, ignored);  // rewritten after the rebuild; another process may do it first
  DiskState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.stats.rejected;
}

void note_loaded(double ms) {
  DiskState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.stats.loaded;
  s.stats.load_ms += ms;
}

std::string disk_store(const std::string& key, const std::vector<std::uint8_t>& payload) {
  DiskState& s = state();
  std::string folder;
  std::uint64_t cap = 0;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    folder = s.folder;
    cap = s.cap_bytes;
  }
  if (folder.empty()) return "";
  std::string error;
  const bool written = write_plan_file(folder, key, payload, error);
  const std::size_t pruned = written ? prune_plan_folder(folder, cap) : 0;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (written) {
    ++s.stats.stored;
  } else {
    ++s.stats.store_failures;
  }
  s.stats.pruned += pruned;
  return error;
}

}  // namespace detail

std::string default_plan_dir() {
  return detail::plan_dir_from_setting(nullptr, std::getenv("XDG_CACHE_HOME"), std::getenv("HOME"));
}

std::string plan_dir() {
  DiskState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.folder;
}

void set_plan_dir(const std::string& folder) {
  const std::string resolved = folder.empty() ? "" : absolute(folder);
  DiskState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.folder = resolved;
}

DiskCacheStats disk_cache_stats() {
  DiskState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

void reset_disk_cache_stats() {
  DiskState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats = DiskCacheStats{};
}

}  // namespace fusedattn
