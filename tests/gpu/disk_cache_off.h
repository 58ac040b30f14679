// GPU tier: the disk cache turned off for a test's lifetime, so its plans are built in this
// process, not restored from what another test or process stored.
#pragma once

#include <string>

#include "fusedattn/disk_cache.h"

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

}  // namespace fusedattn
