// fusedattn/disk_cache.h — compiled plans that persist across processes (DESIGN.md §14).
//
// A plan built once on a machine is written into a folder, and a later process that needs it
// reads it back instead of building it: a few milliseconds instead of tens. Entries are keyed by
// everything that makes a plan valid (the normalized spec and pass, the GPU model and SM, the
// driver, cuDNN, the frontend and fusedattn's own build), checksummed, and written atomically, so
// several processes share one folder safely; anything doubtful is rebuilt and rewritten.
//
// The folder: FUSEDATTN_PLAN_DIR (read once), else $XDG_CACHE_HOME/fusedattn/plans, else
// $HOME/.cache/fusedattn/plans. FUSEDATTN_PLAN_DIR=off (or 0, or empty) turns the disk cache off.
// It holds at most FUSEDATTN_PLAN_DIR_CAP_MB megabytes (default 2048); the oldest entries go first.
#pragma once

#include <cstdint>
#include <string>

namespace fusedattn {

/// Counters of the disk cache since the process started (or since reset_disk_cache_stats).
struct DiskCacheStats {
  std::uint64_t loaded = 0;          ///< plans read back instead of built
  std::uint64_t missing = 0;         ///< lookups that found no entry (the plan was then built)
  std::uint64_t rejected = 0;        ///< entries found unusable (truncated, corrupt, of another format or key,
                                     ///< or refused by cuDNN), then rebuilt and rewritten
  std::uint64_t stored = 0;          ///< plans written
  std::uint64_t store_failures = 0;  ///< writes the file system refused (the plan was used anyway)
  std::uint64_t pruned = 0;          ///< entries deleted to stay under the cap
  double load_ms = 0.0;              ///< time spent reading and restoring the loaded plans
};

/// Default size cap of the folder, in bytes (FUSEDATTN_PLAN_DIR_CAP_MB overrides it).
constexpr std::uint64_t kDefaultPlanDirCapBytes = 2048ull << 20;

/// The folder used when FUSEDATTN_PLAN_DIR is not set, "" if there is no home to put it in.
std::string default_plan_dir();

/// The folder plans persist in now, "" when the disk cache is off.
std::string plan_dir();

/// Changes the folder at run time ("" turns the disk cache off). Plans already in memory stay.
void set_plan_dir(const std::string& folder);

DiskCacheStats disk_cache_stats();
void reset_disk_cache_stats();

}  // namespace fusedattn
