// Rows of a strided gradient summed into a float32 accumulator, and the sum written out: the dQ
// of a causal backward run as key blocks (exec/causal_composite.h), each block a part of it.
#include "exec/row_sums.h"

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exec/cuda_check.h"
#include "exec/element_conversions.cuh"
#include "exec/strided_elements.cuh"
#include "fusedattn/errors.h"

namespace fusedattn::detail {
namespace {

constexpr int kThreads = 256;

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

// The same, 8 elements (16 bytes of f16/bf16) a thread along d, which is contiguous: for every
// layout's gradient rows whose d is a multiple of 8 and whose strides keep rows 16-byte aligned.
struct RowShape {
  std::int64_t heads, rows, chunks;  // chunks of 8 along d
  std::int64_t stride_b, stride_h, stride_s;
};

template <class T>
__global__ void accumulate_chunks_kernel(RowShape shape, const T* src, float* acc, std::int64_t acc_rows,
                                         std::int64_t first_row, bool assign, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t chunk = i % shape.chunks, row = i / shape.chunks;
    const std::int64_t s = row % shape.rows, bh = row / shape.rows;
    const std::int64_t b = bh / shape.heads, h = bh % shape.heads;
    const uint4 bits = *reinterpret_cast<const uint4*>(src + b * shape.stride_b + h * shape.stride_h +
                                                       s * shape.stride_s + chunk * 8);
    const T* x = reinterpret_cast<const T*>(&bits);
    float4* out = reinterpret_cast<float4*>(acc + (bh * acc_rows + first_row + s) * shape.chunks * 8 + chunk * 8);
    float4 lo = assign ? make_float4(0.f, 0.f, 0.f, 0.f) : out[0];
    float4 hi = assign ? make_float4(0.f, 0.f, 0.f, 0.f) : out[1];
    lo.x += to_float(x[0]);
    lo.y += to_float(x[1]);
    lo.z += to_float(x[2]);
    lo.w += to_float(x[3]);
    hi.x += to_float(x[4]);
    hi.y += to_float(x[5]);
    hi.z += to_float(x[6]);
    hi.w += to_float(x[7]);
    out[0] = lo;
    out[1] = hi;
  }
}

bool chunked(const TensorDesc& block, const void* src) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(src) % 16 == 0;
  return aligned && block.strides[3] == 1 && block.dims[3] % 8 == 0 && block.strides[0] % 8 == 0 &&
         block.strides[1] % 8 == 0 && block.strides[2] % 8 == 0;
}

template <class T>
void launch_accumulate(const TensorDesc& block, const T* src, float* acc, std::int64_t acc_rows, std::int64_t first_row,
                       bool assign, cudaStream_t stream) {
  if (chunked(block, src)) {
    const RowShape shape{block.dims[1], block.dims[2], block.dims[3] / 8, block.strides[0], block.strides[1],
                         block.strides[2]};
    const std::int64_t n = block.dims[0] * block.dims[1] * block.dims[2] * shape.chunks;
    accumulate_chunks_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(shape, src, acc, acc_rows, first_row, assign, n);
  } else {
    const std::int64_t n = block.dims[0] * block.dims[1] * block.dims[2] * block.dims[3];
    accumulate_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(make_strided(block), src, acc, acc_rows, first_row,
                                                            assign, n);
  }
}

template <class T>
__global__ void store_kernel(const float* acc, Strided dst, T* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[strided_offset(dst, i)] = from_float<T>(acc[i]);
  }
}

template <class T>
__global__ void store_chunks_kernel(const float* acc, RowShape shape, T* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t chunk = i % shape.chunks, row = i / shape.chunks;
    const std::int64_t s = row % shape.rows, bh = row / shape.rows;
    const std::int64_t b = bh / shape.heads, h = bh % shape.heads;
    const float4* in = reinterpret_cast<const float4*>(acc + i * 8);
    const float4 lo = in[0], hi = in[1];
    uint4 bits;
    T* x = reinterpret_cast<T*>(&bits);
    x[0] = from_float<T>(lo.x);
    x[1] = from_float<T>(lo.y);
    x[2] = from_float<T>(lo.z);
    x[3] = from_float<T>(lo.w);
    x[4] = from_float<T>(hi.x);
    x[5] = from_float<T>(hi.y);
    x[6] = from_float<T>(hi.z);
    x[7] = from_float<T>(hi.w);
    *reinterpret_cast<uint4*>(out + b * shape.stride_b + h * shape.stride_h + s * shape.stride_s + chunk * 8) = bits;
  }
}

template <class T>
void launch_store(const float* acc, const TensorDesc& dst, T* out, cudaStream_t stream) {
  if (chunked(dst, out)) {
    const RowShape shape{dst.dims[1], dst.dims[2], dst.dims[3] / 8, dst.strides[0], dst.strides[1], dst.strides[2]};
    const std::int64_t n = dst.dims[0] * dst.dims[1] * dst.dims[2] * shape.chunks;
    store_chunks_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(acc, shape, out, n);
  } else {
    const std::int64_t n = dst.dims[0] * dst.dims[1] * dst.dims[2] * dst.dims[3];
    store_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(acc, make_strided(dst), out, n);
  }
}

std::int64_t elements(const TensorDesc& desc) { return desc.dims[0] * desc.dims[1] * desc.dims[2] * desc.dims[3]; }

}  // namespace

void accumulate_rows(const TensorDesc& block, const void* src, float* acc, std::int64_t acc_rows,
                     std::int64_t first_row, bool assign, cudaStream_t stream) {
  if (elements(block) == 0) return;
  if (block.dtype == DType::bf16) {
    launch_accumulate(block, static_cast<const __nv_bfloat16*>(src), acc, acc_rows, first_row, assign, stream);
  } else if (block.dtype == DType::f16) {
    launch_accumulate(block, static_cast<const __half*>(src), acc, acc_rows, first_row, assign, stream);
  } else {
    throw InvalidArgument("dtype", to_string(block.dtype), "f16 or bf16 for the row sums");
  }
  check_cuda(cudaGetLastError(), "accumulate_rows launch");
}

void store_rows(const float* acc, const TensorDesc& dst, void* out, cudaStream_t stream) {
  if (elements(dst) == 0) return;
  if (dst.dtype == DType::bf16) {
    launch_store(acc, dst, static_cast<__nv_bfloat16*>(out), stream);
  } else if (dst.dtype == DType::f16) {
    launch_store(acc, dst, static_cast<__half*>(out), stream);
  } else {
    throw InvalidArgument("dtype", to_string(dst.dtype), "f16 or bf16 for the row sums");
  }
  check_cuda(cudaGetLastError(), "store_rows launch");
}

}  // namespace fusedattn::detail
