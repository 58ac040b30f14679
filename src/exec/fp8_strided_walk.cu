// The FP8 element kernels' logical walk (fp8_strided_walk.h). Conversions are cuda_fp8.h's with
// __NV_SATFINITE, as on the memory-order path (fp8_rows.cu), so both walks give the same bits.
// Amax is reduced on the bits of |x| (abs_bits: NaN propagates), one atomicMax per block.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "exec/cuda_check.h"
#include "exec/element_conversions.cuh"
#include "exec/fp8_strided_walk.h"
#include "exec/strided_elements.cuh"

namespace fusedattn::detail {

namespace {

constexpr int kThreads = 256;

__device__ void block_max_into(unsigned int mine, unsigned int* out) { detail::block_max_into<kThreads>(mine, out); }

template <class T>
__global__ void amax_kernel(Strided t, std::int64_t n, const T* data, unsigned int* amax) {
  unsigned int mine = 0;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    mine = max(mine, abs_bits(to_float(data[strided_offset(t, x)])));
  }
  block_max_into(mine, amax);
}

template <class Src, class Dst>
__global__ void quantize_kernel(Strided src_t, Strided dst_t, std::int64_t n, const Src* src, Dst* dst,
                                const float* scale, unsigned int* amax) {
  const float s = *scale;
  unsigned int mine = 0;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    const float value = to_float(src[strided_offset(src_t, x)]);
    mine = max(mine, abs_bits(value));
    dst[strided_offset(dst_t, x)] = from_float<Dst>(value * s);
  }
  if (amax != nullptr) block_max_into(mine, amax);  // uniform over the grid
}

template <class Src, class Dst>
__global__ void dequantize_kernel(Strided src_t, Strided dst_t, std::int64_t n, const Src* src, Dst* dst,
                                  const float* descale) {
  const float s = *descale;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    dst[strided_offset(dst_t, x)] = from_float<Dst>(to_float(src[strided_offset(src_t, x)]) * s);
  }
}

template <class T>
void launch_amax(const TensorDesc& desc, const void* data, float* amax, cudaStream_t stream) {
  const std::int64_t n = desc.elements();
  amax_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      make_strided(desc), n, static_cast<const T*>(data), reinterpret_cast<unsigned int*>(amax));
  detail::check_cuda(cudaGetLastError(), "measure_amax's kernel launch");
}

template <class Src, class Dst>
void launch_quantize(const Fp8Quantization& t, cudaStream_t stream) {
  const std::int64_t n = t.src_desc.elements();
  quantize_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      make_strided(t.src_desc), make_strided(t.dst_desc), n, static_cast<const Src*>(t.src), static_cast<Dst*>(t.dst),
      t.scale, reinterpret_cast<unsigned int*>(t.amax));
  detail::check_cuda(cudaGetLastError(), "quantize_fp8's kernel launch");
}

template <class Src, class Dst>
void launch_dequantize(const Fp8Dequantization& t, cudaStream_t stream) {
  const std::int64_t n = t.src_desc.elements();
  dequantize_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      make_strided(t.src_desc), make_strided(t.dst_desc), n, static_cast<const Src*>(t.src), static_cast<Dst*>(t.dst),
      t.descale);
  detail::check_cuda(cudaGetLastError(), "dequantize_fp8's kernel launch");
}

}  // namespace

void walk_logically(const Fp8Amax& t, cudaStream_t stream) {
  switch (t.desc.dtype) {
    case DType::f16: return launch_amax<__half>(t.desc, t.data, t.amax, stream);
    case DType::bf16: return launch_amax<__nv_bfloat16>(t.desc, t.data, t.amax, stream);
    case DType::e4m3: return launch_amax<E4M3>(t.desc, t.data, t.amax, stream);
    case DType::e5m2: return launch_amax<E5M2>(t.desc, t.data, t.amax, stream);
  }
}

void walk_logically(const Fp8Quantization& t, cudaStream_t stream) {
  const bool e4m3 = t.dst_desc.dtype == DType::e4m3;
  if (t.src_desc.dtype == DType::bf16) {
    if (e4m3) return launch_quantize<__nv_bfloat16, E4M3>(t, stream);
    return launch_quantize<__nv_bfloat16, E5M2>(t, stream);
  }
  if (e4m3) return launch_quantize<__half, E4M3>(t, stream);
  launch_quantize<__half, E5M2>(t, stream);
}

void walk_logically(const Fp8Dequantization& t, cudaStream_t stream) {
  const bool e4m3 = t.src_desc.dtype == DType::e4m3;
  if (t.dst_desc.dtype == DType::bf16) {
    if (e4m3) return launch_dequantize<E4M3, __nv_bfloat16>(t, stream);
    return launch_dequantize<E5M2, __nv_bfloat16>(t, stream);
  }
  if (e4m3) return launch_dequantize<E4M3, __half>(t, stream);
  launch_dequantize<E5M2, __half>(t, stream);
}

}  // namespace fusedattn::detail
