// The FP8 element kernels' fast path: up to four tensors in one launch, each walked in memory order
// (exec/memory_walk.h) with one wide load and store per group of V consecutive elements, the amax
// as a block reduction with one atomic per block. A job whose tensors share no row of consecutive
// elements, or whose rows or pointers do not align to a group, is left to the logical walk
// (fp8_scaling.cu), which reads any strides.
//
// Bit for bit what the logical walk computes: the same per-element conversions
// (exec/element_conversions.cuh), only the order of the reads differs, and a max does not care.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "exec/cuda_check.h"
#include "exec/element_conversions.cuh"
#include "exec/fp8_rows.h"
#include "exec/strided_elements.cuh"

namespace fusedattn::detail {

namespace {

constexpr int kThreads = 256;

// V elements of T as one aligned access: 16 bytes or less in one instruction, 32 in two.
template <class T, int V>
struct alignas(sizeof(T) * V >= 16 ? 16 : sizeof(T) * V) Group {
  T value[V];
};

// Row job j's element offsets of vector v (V elements) in the source and the destination.
template <int V>
__device__ inline void offsets_of(const RowJob& job, std::int64_t v, std::int64_t& src, std::int64_t& dst) {
  if (job.outer == 0) {  // one dense row: no division at all
    src = dst = v * V;
    return;
  }
  std::int64_t row = v / job.row_groups;
  src = dst = (v - row * job.row_groups) * V;
  for (int k = job.outer - 1; k >= 0; --k) {
    const std::int64_t index = row % job.dims[k];
    row /= job.dims[k];
    src += index * job.src_strides[k];
    dst += index * job.dst_strides[k];
  }
}

// blockIdx.y picks the job; the grid's x dimension strides over its groups.
template <class Src, class Dst, int V, RowOp kOp>
__global__ void rows_kernel(RowJobs jobs) {
  const RowJob& job = jobs.job[blockIdx.y];
  const float factor = kOp == RowOp::amax ? 1.0f : *job.factor;
  const Src* src = static_cast<const Src*>(job.src);
  Dst* dst = static_cast<Dst*>(job.dst);
  unsigned int mine = 0;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < job.groups; v += step) {
    std::int64_t src_at, dst_at;
    offsets_of<V>(job, v, src_at, dst_at);
    const Group<Src, V> in = *reinterpret_cast<const Group<Src, V>*>(src + src_at);
    Group<Dst, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float x = to_float(in.value[i]);
      if constexpr (kOp != RowOp::dequantize) mine = max(mine, abs_bits(x));
      if constexpr (kOp != RowOp::amax) out.value[i] = from_float<Dst>(x * factor);
    }
    if constexpr (kOp != RowOp::amax) *reinterpret_cast<Group<Dst, V>*>(dst + dst_at) = out;
  }
  if constexpr (kOp != RowOp::dequantize) {
    if (job.amax != nullptr) block_max_into<kThreads>(mine, job.amax);  // uniform over the block
  }
}

template <class Src, class Dst, int V, RowOp kOp>
void launch(const RowJobs& jobs, int count, cudaStream_t stream) {
  std::int64_t most = 0;
  for (int j = 0; j < count; ++j) most = most > jobs.job[j].groups ? most : jobs.job[j].groups;
  const dim3 grid(grid_stride_blocks(most, kThreads, 2048), static_cast<unsigned int>(count));
  rows_kernel<Src, Dst, V, kOp><<<grid, kThreads, 0, stream>>>(jobs);
  check_cuda(cudaGetLastError(), "the FP8 element kernel's launch");
}

template <class Src, class Dst, RowOp kOp>
void launch_width(const RowJobs& jobs, int count, int width, cudaStream_t stream) {
  if (width == 16) return launch<Src, Dst, 16, kOp>(jobs, count, stream);
  launch<Src, Dst, 8, kOp>(jobs, count, stream);
}

// Only the pairs the public calls take: 16-bit into FP8, FP8 into 16-bit, and any type's amax
// (whose destination is never written: the source's type stands in).
template <RowOp kOp, class Fp8>
void launch_16_bit(DType sixteen, const RowJobs& jobs, int count, int width, cudaStream_t stream) {
  const bool bf16 = sixteen == DType::bf16;
  if constexpr (kOp == RowOp::quantize) {
    if (bf16) return launch_width<__nv_bfloat16, Fp8, kOp>(jobs, count, width, stream);
    return launch_width<__half, Fp8, kOp>(jobs, count, width, stream);
  } else {
    if (bf16) return launch_width<Fp8, __nv_bfloat16, kOp>(jobs, count, width, stream);
    return launch_width<Fp8, __half, kOp>(jobs, count, width, stream);
  }
}

}  // namespace

void launch_rows(RowOp op, DType src, DType dst, const RowJobs& jobs, int count, int width, cudaStream_t stream) {
  if (count <= 0) return;
  if (op == RowOp::amax) {
    switch (src) {
      case DType::f16: return launch_width<__half, __half, RowOp::amax>(jobs, count, width, stream);
      case DType::bf16: return launch_width<__nv_bfloat16, __nv_bfloat16, RowOp::amax>(jobs, count, width, stream);
      case DType::e4m3: return launch_width<E4M3, E4M3, RowOp::amax>(jobs, count, width, stream);
      case DType::e5m2: return launch_width<E5M2, E5M2, RowOp::amax>(jobs, count, width, stream);
    }
    return;
  }
  const DType fp8 = op == RowOp::quantize ? dst : src, sixteen = op == RowOp::quantize ? src : dst;
  if (op == RowOp::quantize) {
    if (fp8 == DType::e4m3) return launch_16_bit<RowOp::quantize, E4M3>(sixteen, jobs, count, width, stream);
    return launch_16_bit<RowOp::quantize, E5M2>(sixteen, jobs, count, width, stream);
  }
  if (fp8 == DType::e4m3) return launch_16_bit<RowOp::dequantize, E4M3>(sixteen, jobs, count, width, stream);
  launch_16_bit<RowOp::dequantize, E5M2>(sixteen, jobs, count, width, stream);
}

}  // namespace fusedattn::detail
