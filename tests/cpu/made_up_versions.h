// Tier 1 helper: library versions for policy and key tests, as made-up devices are.
#pragma once

#include "fusedattn/support.h"

namespace fusedattn {

/// cuDNN `runtime` loaded (its encoding: 9.19.0 -> 91900), 9.19 headers, frontend `frontend`.
inline Versions made_up_versions(int runtime, int frontend = 13200) {
  Versions v;
  v.cudnn_runtime = runtime;
  v.cudnn_compiled = 91900;
  v.frontend = frontend;
  return v;
}

}  // namespace fusedattn
