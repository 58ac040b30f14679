// The terms the references add to the scaled scores (bias and ALiBi), written once for the CPU
// and the GPU reference so that they cannot disagree on an index or a slope.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "fusedattn/reference.h"
#include "spec/window_rule.h"  // FUSEDATTN_HOST_DEVICE

namespace fusedattn::detail {

/// ALiBi slope of head h of `heads` (cuDNN's get_alibi_slope, in double): with n the largest
/// power of two <= heads, heads h < n get 2^(-8(h+1)/n) and the rest 2^(-4(2(h-n)+1)/n).
FUSEDATTN_HOST_DEVICE inline double alibi_slope(std::int64_t h, std::int64_t heads) {
  std::int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  const double exponent = h < n ? -8.0 * static_cast<double>(h + 1) / static_cast<double>(n)
                                : -4.0 * static_cast<double>(2 * (h - n) + 1) / static_cast<double>(n);
#if defined(__CUDA_ARCH__)
  return ::exp2(exponent);
#else
  return std::exp2(exponent);
#endif
}

/// Where element (b, h, i, j) of the logical [b, h_q, s_q, s_kv] score matrix reads its bias in a
/// contiguous tensor of bias_dims' shape: a broadcast dim (size 1) has stride 0, so every index
/// along it lands on element 0. Summing dS into at(b, h, i, j) therefore sums over exactly the
/// broadcast dims, which is dBias.
struct BiasIndex {
  std::int64_t stride_b = 0, stride_h = 0, stride_i = 0;  // the stride of j is 1
  FUSEDATTN_HOST_DEVICE std::int64_t at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return b * stride_b + h * stride_h + i * stride_i + j;
  }
};

/// The bias's element count (0 without a bias).
inline std::int64_t bias_elements(const ReferenceProblem& p) {
  const std::array<std::int64_t, 4> dims = bias_dims(p.bias, p.batch, p.heads_q, p.seq_q, p.seq_kv);
  return dims[0] * dims[1] * dims[2] * dims[3];
}

inline BiasIndex bias_index(const ReferenceProblem& p) {
  const std::array<std::int64_t, 4> dims = bias_dims(p.bias, p.batch, p.heads_q, p.seq_q, p.seq_kv);
  BiasIndex index;
  if (p.bias == Bias::none) return index;
  index.stride_i = dims[2] == 1 ? 0 : dims[3];
  index.stride_h = dims[1] == 1 ? 0 : dims[2] * dims[3];
  index.stride_b = dims[0] == 1 ? 0 : dims[1] * dims[2] * dims[3];
  return index;
}

}  // namespace fusedattn::detail
