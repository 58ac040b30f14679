// Internal: element n of the logical [b, h, s, d] order of a strided tensor, for the element-wise
// kernels (the FP8 scaling kernels, the row sums, the GPU reference's gather and scatter), and the
// grid their grid-stride loops take.
#pragma once

#include <cstdint>

#include "fusedattn/tensor.h"

namespace fusedattn::detail {

/// Blocks of `threads` for a grid-stride loop over n elements: one element a thread, up to
/// `max_blocks` (4096 blocks of 256 fill an H200 many times over; the loop does the rest).
inline unsigned int grid_stride_blocks(std::int64_t n, int threads, std::int64_t max_blocks = 4096) {
  const std::int64_t wanted = (n + threads - 1) / threads;
  return static_cast<unsigned int>(wanted < max_blocks ? wanted : max_blocks);
}

/// A descriptor's dims and strides, passed to kernels by value.
struct Strided {
  std::int64_t dims[4], strides[4];
};

inline Strided make_strided(const TensorDesc& desc) {
  Strided out{};
  for (int axis = 0; axis < 4; ++axis) {
    out.dims[axis] = desc.dims[axis];
    out.strides[axis] = desc.strides[axis];
  }
  return out;
}

/// Offset in elements of the n-th element of the logical [b, h, s, d] order.
__device__ inline std::int64_t strided_offset(const Strided& t, std::int64_t n) {
  std::int64_t offset = 0;
#pragma unroll
  for (int axis = 3; axis >= 0; --axis) {
    offset += (n % t.dims[axis]) * t.strides[axis];
    n /= t.dims[axis];
  }
  return offset;
}

}  // namespace fusedattn::detail
