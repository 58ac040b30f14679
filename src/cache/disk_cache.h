// Internal: the disk cache's lookups and writes as the plan store uses them (fusedattn/disk_cache.h
// has the settings and counters). Nothing here throws: a disk that fails only costs a build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/plan_file.h"

namespace fusedattn::detail {

struct DiskLookup {
  PlanFileCheck check = PlanFileCheck::missing;  ///< loaded: `payload` holds the entry; off: missing
  std::vector<std::uint8_t> payload;
  std::string path;  ///< the entry's file ("" when the disk cache is off)
};

/// The entry of `key` in the current folder. Counts a miss, or a rejection for a file that is
/// there but unusable; a loaded entry is counted by note_loaded once it has been restored.
DiskLookup disk_lookup(const std::string& key);

/// A looked-up entry whose payload could not be restored: counted as rejected and deleted.
void note_unusable(const DiskLookup& lookup);
/// A looked-up entry restored into a plan in `ms` milliseconds (reading included).
void note_loaded(double ms);

/// Writes `key`'s entry into the current folder (if any), then keeps the folder under its cap.
/// Empty when written (or off); else the file system's reason, counted as a store failure.
std::string disk_store(const std::string& key, const std::vector<std::uint8_t>& payload);

/// Parses FUSEDATTN_PLAN_DIR_CAP_MB: a positive number of megabytes, or InvalidArgument.
std::uint64_t parse_cap_megabytes(const char* text);

/// Parses FUSEDATTN_PLAN_DIR's value (null: unset) into the folder to use, "" for off.
std::string plan_dir_from_setting(const char* value, const char* xdg_cache_home, const char* home);

}  // namespace fusedattn::detail
