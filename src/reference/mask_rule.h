// The causal visibility rule, shared by the CPU and GPU references so that they cannot disagree.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FUSEDATTN_HOST_DEVICE __host__ __device__
#else
#define FUSEDATTN_HOST_DEVICE
#endif

namespace fusedattn::detail {

/// True when query row i may see key column j. Bottom-right alignment shifts the diagonal right by
/// s_kv - s_q so that the last query row sees the last key; with s_q > s_kv the shift is negative
/// and the first s_q - s_kv rows see nothing at all.
FUSEDATTN_HOST_DEVICE inline bool mask_visible(bool causal, bool bottom_right, std::int64_t seq_q,
                                               std::int64_t seq_kv, std::int64_t i, std::int64_t j) {
  if (!causal) return true;
  const std::int64_t shift = bottom_right ? seq_kv - seq_q : 0;
  return j <= i + shift;
}

}  // namespace fusedattn::detail
