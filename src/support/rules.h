// Internal: what the support policy's rule files share (policy.cpp runs every rule; fp8_rules.cpp
// holds the FP8 and MXFP8 ones).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fusedattn/support.h"

namespace fusedattn::detail {

using Reasons = std::vector<Reason>;

inline constexpr const char* kHopper = "a Hopper (SM 9.0) GPU";

inline std::string sm_text(const DeviceCaps& caps) {
  return "SM " + std::to_string(caps.sm_major) + "." + std::to_string(caps.sm_minor);
}

/// The two head dims, named as the spec string names them, so a reason points at the key to change.
inline std::pair<const char*, std::int64_t> head_dims(const AttentionSpec& spec, int which) {
  return which == 0 ? std::make_pair("d_qk", spec.head_dim_qk()) : std::make_pair("d_v", spec.head_dim_v());
}

/// FP8 (q, k, v in E4M3 or E5M2) and MXFP8 block scaling: fp8_rules.cpp.
void fp8_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions, Reasons& out);
void mxfp8_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions, Reasons& out);

}  // namespace fusedattn::detail
