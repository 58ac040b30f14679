// Internal: one element of every attention dtype to float and back, for the element-wise kernels
// (FP8 scaling, the grouped-head sums of kv_expansion.cu, the GPU reference's gather and scatter).
//
// Conversions to FP8 are cuda_fp8.h's with __NV_SATFINITE (round to nearest even, saturating),
// which the host codecs (src/reference/fp8_codec.cpp) reproduce bit for bit; FP8 to float is exact.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace fusedattn::detail {

/// One FP8 element, tagged with its interpretation so that a kernel template picks the conversion.
template <__nv_fp8_interpretation_t kKind>
struct Fp8 {
  __nv_fp8_storage_t bits;
};
using E4M3 = Fp8<__NV_E4M3>;
using E5M2 = Fp8<__NV_E5M2>;
static_assert(sizeof(E4M3) == 1 && sizeof(E5M2) == 1, "FP8 elements are one byte");

__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <__nv_fp8_interpretation_t kKind>
__device__ inline float to_float(Fp8<kKind> x) {  // exact: every FP8 value is a half
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(x.bits, kKind)));
}

template <class T>
__device__ T from_float(float x);
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ inline E4M3 from_float<E4M3>(float x) { return {__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)}; }
template <>
__device__ inline E5M2 from_float<E5M2>(float x) { return {__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)}; }

/// |x| as bits: non-negative floats order like their bit patterns, and every NaN's bits (above
/// 0x7f800000) lie above infinity's, so an unsigned max propagates NaN where fmaxf would drop it.
__device__ inline unsigned int abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

/// The block's largest `mine` into *out (bits as abs_bits gives them) by one atomicMax; *out starts
/// at 0 on the stream. Every thread of the block, of kThreads, must call it.
template <int kThreads>
__device__ inline void block_max_into(unsigned int mine, unsigned int* out) {
  constexpr int kWarps = kThreads / 32;
  __shared__ unsigned int warp_max[kWarps];
  // Shuffles rather than __reduce_max_sync, which needs sm_80 (the build may target older GPUs).
  for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2) {
    mine = max(mine, __shfl_xor_sync(0xffffffffu, mine, lane_mask));
  }
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int best = 0;
    for (int w = 0; w < kWarps; ++w) best = max(best, warp_max[w]);
    if (best != 0) atomicMax(out, best);
  }
}

}  // namespace fusedattn::detail
