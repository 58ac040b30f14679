// Internal: the FP8 element kernels' memory-order path (fp8_rows.cu) as fp8_scaling.cu calls it:
// which tensors it takes (row_job), and one launch for up to kMaxRowJobs of them.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exec/memory_walk.h"
#include "fusedattn/tensor.h"

namespace fusedattn::detail {

enum class RowOp : std::uint8_t { quantize, dequantize, amax };

/// One tensor pair of a launch: `groups` groups of the launch's width, `row_groups` to a row.
struct RowJob {
  const void* src = nullptr;
  void* dst = nullptr;            ///< not written by an amax pass
  const float* factor = nullptr;  ///< the scale (quantize) or descale (dequantize)
  unsigned int* amax = nullptr;   ///< max |src| as abs_bits, by atomicMax; none where null
  std::int64_t groups = 0, row_groups = 0;
  int outer = 0;
  std::int64_t dims[3] = {1, 1, 1}, src_strides[3] = {0, 0, 0}, dst_strides[3] = {0, 0, 0};
};

constexpr int kMaxRowJobs = 4;  ///< Q, K, V and dO of a step in one launch
struct RowJobs {
  RowJob job[kMaxRowJobs];
};

/// The widest group (16 or 8 elements) in which `src` and `dst` can be walked in memory order, or
/// 0 where they cannot: no common row (memory_walk.h), rows or strides that are not multiples of
/// the group, or a pointer not aligned to one group's bytes in its type (16 at most). `job` gets the
/// walk in groups of that width; its pointers and amax are the caller's to set.
inline int row_width(const TensorDesc& src, const void* src_data, const TensorDesc& dst, const void* dst_data,
                     RowJob& job) {
  MemoryWalk walk;
  if (!plan_memory_walk(src, dst, walk)) return 0;
  auto aligned = [](const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; };
  for (int width : {16, 8}) {
    const std::size_t src_bytes = size_of(src.dtype) * width, dst_bytes = size_of(dst.dtype) * width;
    if (!rows_align_to(walk, width) || !aligned(src_data, src_bytes < 16 ? src_bytes : 16) ||
        (dst_data != nullptr && !aligned(dst_data, dst_bytes < 16 ? dst_bytes : 16))) {
      continue;
    }
    job.groups = walk.rows * walk.row / width;
    job.row_groups = walk.row / width;
    job.outer = walk.outer;
    for (int k = 0; k < 3; ++k) {
      job.dims[k] = walk.dims[k];
      job.src_strides[k] = walk.src_strides[k];
      job.dst_strides[k] = walk.dst_strides[k];
    }
    return width;
  }
  return 0;
}

/// One launch of `count` (1 to kMaxRowJobs) jobs of one op, one source and one destination type,
/// walked in groups of `width` (16 or 8, as row_width gave for each): quantize takes a 16-bit
/// source into FP8, dequantize FP8 into 16-bit, amax reads any type (its destination type unused).
/// The jobs' amaxes must be zero on the stream first.
void launch_rows(RowOp op, DType src, DType dst, const RowJobs& jobs, int count, int width, cudaStream_t stream);

}  // namespace fusedattn::detail
