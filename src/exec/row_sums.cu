// Rows of a strided gradient summed into a float32 accumulator, and the sum written out: the dQ
// of a causal backward run as key blocks (exec/causal_composite.h), each block a part of it.
#include "exec/row_sums.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exec/cuda_check.h"
#include "exec/element_conversions.cuh"
#include "exec/strided_elements.cuh"
#include "fusedattn/errors.h"

namespace fusedattn::detail {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxGrid = 8192;

unsigned int grid_for(std::int64_t n) {
  const std::int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(wanted < kMaxGrid ? wanted : kMaxGrid);
}

// Element n of the block's logical [b, h, rows, d] order lands in row first_row + s of the
// accumulator, a contiguous [b, h, acc_rows, d].
__device__ inline std::int64_t acc_index(const Strided& block, std::int64_t n, std::int64_t acc_rows,
                                         std::int64_t first_row) {
  const std::int64_t d = n % block.dims[3];
  const std::int64_t s = (n / block.dims[3]) % block.dims[2];
  const std::int64_t bh = n / (block.dims[3] * block.dims[2]);
  return (bh * acc_rows + first_row + s) * block.dims[3] + d;
}

template <class T>
__global__ void accumulate_kernel(Strided block, const T* src, float* acc, std::int64_t acc_rows,
                                  std::int64_t first_row, bool assign, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float x = to_float(src[strided_offset(block, i)]);
    float& slot = acc[acc_index(block, i, acc_rows, first_row)];
    slot = assign ? x : slot + x;
  }
}

template <class T>
__global__ void store_kernel(const float* acc, Strided dst, T* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[strided_offset(dst, i)] = from_float<T>(acc[i]);
  }
}

std::int64_t elements(const TensorDesc& desc) { return desc.dims[0] * desc.dims[1] * desc.dims[2] * desc.dims[3]; }

}  // namespace

void accumulate_rows(const TensorDesc& block, const void* src, float* acc, std::int64_t acc_rows,
                     std::int64_t first_row, bool assign, cudaStream_t stream) {
  const std::int64_t n = elements(block);
  if (n == 0) return;
  const Strided strided = make_strided(block);
  if (block.dtype == DType::bf16) {
    accumulate_kernel<<<grid_for(n), kThreads, 0, stream>>>(strided, static_cast<const __nv_bfloat16*>(src), acc,
                                                            acc_rows, first_row, assign, n);
  } else if (block.dtype == DType::f16) {
    accumulate_kernel<<<grid_for(n), kThreads, 0, stream>>>(strided, static_cast<const __half*>(src), acc, acc_rows,
                                                            first_row, assign, n);
  } else {
    throw InvalidArgument("dtype", to_string(block.dtype), "f16 or bf16 for the row sums");
  }
  check_cuda(cudaGetLastError(), "accumulate_rows launch");
}

void store_rows(const float* acc, const TensorDesc& dst, void* out, cudaStream_t stream) {
  const std::int64_t n = elements(dst);
  if (n == 0) return;
  const Strided strided = make_strided(dst);
  if (dst.dtype == DType::bf16) {
    store_kernel<<<grid_for(n), kThreads, 0, stream>>>(acc, strided, static_cast<__nv_bfloat16*>(out), n);
  } else if (dst.dtype == DType::f16) {
    store_kernel<<<grid_for(n), kThreads, 0, stream>>>(acc, strided, static_cast<__half*>(out), n);
  } else {
    throw InvalidArgument("dtype", to_string(dst.dtype), "f16 or bf16 for the row sums");
  }
  check_cuda(cudaGetLastError(), "store_rows launch");
}

}  // namespace fusedattn::detail
