// GPU tier: where a test's plans come from. DiskCacheOff turns the disk cache off for the test's
// lifetime, so its plans are built in this process; FreshPlanFolder gives it a disk cache folder of
// its own (and an empty plan cache), removed after it.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <stdlib.h>

#include "fusedattn/disk_cache.h"
#include "fusedattn/plan_cache.h"

namespace fusedattn {

class DiskCacheOff {
 public:
  DiskCacheOff() : was_(plan_dir()) { set_plan_dir(""); }
  ~DiskCacheOff() { set_plan_dir(was_); }
  DiskCacheOff(const DiskCacheOff&) = delete;
  DiskCacheOff& operator=(const DiskCacheOff&) = delete;

 private:
  std::string was_;
};

class FreshPlanFolder {
 public:
  FreshPlanFolder() : previous_(plan_dir()) {
    char pattern[] = "/tmp/fusedattn-gpu-plans-XXXXXX";
    if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    folder_ = pattern;
    set_plan_dir(folder_);
    clear_plan_cache();
    reset_disk_cache_stats();
  }
  ~FreshPlanFolder() {
    clear_plan_cache();
    set_plan_dir(previous_);
    std::error_code ignored;
    std::filesystem::remove_all(folder_, ignored);
  }
  FreshPlanFolder(const FreshPlanFolder&) = delete;
  FreshPlanFolder& operator=(const FreshPlanFolder&) = delete;
  const std::string& folder() const { return folder_; }
  std::vector<std::filesystem::path> entries() const {
    std::vector<std::filesystem::path> out;
    for (const auto& entry : std::filesystem::directory_iterator(folder_)) out.push_back(entry.path());
    return out;
  }

 private:
  std::string previous_, folder_;
};

}  // namespace fusedattn
