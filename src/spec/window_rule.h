// The window visibility rule: which keys a query row sees. One definition for the spec (FLOP
// counts), the policy and both references (CPU and GPU), so that they cannot disagree.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FUSEDATTN_HOST_DEVICE __host__ __device__
#else
#define FUSEDATTN_HOST_DEVICE
#endif

namespace fusedattn::detail {

/// The keys query row i sees: [first, last], empty when first > last. The diagonal sits at
/// p = i (top-left) or p = i + s_kv - s_q (bottom-right, so the last row meets the last key);
/// keys p - left < j <= p + right are visible, and a bound of -1 leaves that side open.
struct KeyRange {
  std::int64_t first, last;
  FUSEDATTN_HOST_DEVICE bool empty() const { return first > last; }
  FUSEDATTN_HOST_DEVICE std::int64_t size() const { return empty() ? 0 : last - first + 1; }
  FUSEDATTN_HOST_DEVICE bool contains(std::int64_t j) const { return first <= j && j <= last; }
};

FUSEDATTN_HOST_DEVICE inline KeyRange visible_keys(std::int64_t left, std::int64_t right, bool bottom_right,
                                                   std::int64_t seq_q, std::int64_t seq_kv, std::int64_t i) {
  const std::int64_t p = bottom_right ? i + seq_kv - seq_q : i;
  KeyRange range{0, seq_kv - 1};
  if (left >= 0 && p - left + 1 > range.first) range.first = p - left + 1;
  if (right >= 0 && p + right < range.last) range.last = p + right;
  return range;
}

}  // namespace fusedattn::detail
