// FP8 per-tensor scaling on the device: amax, quantize, dequantize and the scale updates of fusedattn/fp8.h.
//
// The element kernels are grid-stride loops over the logical [b, h, s, d] order, each element's
// address from the strides, so any layout works and in the usual ones (d fastest) a warp touches
// consecutive addresses. Conversions are cuda_fp8.h's with __NV_SATFINITE, which the host codecs
// (src/reference/fp8_codec.cpp) reproduce bit for bit.
//
// Amax is reduced on the bits of |x| (abs_bits: NaN propagates). Each block reduces to one value and
// does one atomicMax into the output, which is zeroed on the stream first.
//
// A ragged tensor (batch stride 0) is refused: its sequences sit at run-time offsets these calls do
// not take, and read as written (every entry at offset 0, as gather_to_float_gpu reads it) a
// quantize would race b writes onto the first entry. Pass the packed tokens as one dense entry.
#include <cfloat>
#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "exec/cuda_check.h"
#include "exec/element_conversions.cuh"
#include "exec/strided_elements.cuh"
#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"

namespace fusedattn {

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H200 several times over; the grid-stride loop takes the rest, and fewer
// blocks mean fewer atomics on the amax.

using detail::abs_bits;
using detail::E4M3;
using detail::E5M2;
using detail::from_float;
using detail::grid_stride_blocks;
using detail::make_strided;
using detail::Strided;
using detail::strided_offset;
using detail::to_float;

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

// fp8_max / (amax * 2^margin), or 1 where the amax is not a positive finite number. A scale past
// float's range is clamped into it, so that descale = 1 / scale stays finite and non-zero.
__device__ void write_scale(float amax, float fp8_max, int margin, float* scale, float* descale) {
  float s = 1.0f;
  if (amax > 0.0f && isfinite(amax)) s = fminf(fmaxf(ldexpf(fp8_max / amax, -margin), FLT_MIN), FLT_MAX);
  *scale = s;
  *descale = 1.0f / s;
}

__global__ void scale_from_amax_kernel(const float* amax, float fp8_max, int margin, float* scale, float* descale) {
  write_scale(*amax, fp8_max, margin, scale, descale);
}

// NaN wins, so that a NaN amax anywhere in the history shows (as scale 1, by write_scale).
__device__ float max_with_nan(float a, float b) { return (isnan(a) || a > b) ? a : b; }

// One block. The history shifts in chunks of kThreads slots from the top down: each chunk reads
// all its sources before the barrier and writes after it, and its sources lie below every slot a
// higher chunk wrote, so in place and out of place run the same code.
__global__ void delayed_scaling_kernel(const float* history_in, float* history_out, std::int64_t length,
                                       const float* amax, float fp8_max, int margin, float* scale, float* descale) {
  const float newest = *amax;  // read before any barrier, so before any write to the history
  float mine = threadIdx.x == 0 ? newest : 0.0f;
  for (std::int64_t top = length; top > 1; top -= kThreads) {
    const std::int64_t slot = top - 1 - threadIdx.x;
    float moved = 0.0f;
    if (slot >= 1) {
      moved = history_in[slot - 1];
      mine = max_with_nan(mine, moved);
    }
    __syncthreads();
    if (slot >= 1) history_out[slot] = moved;
  }
  __shared__ float partial[kThreads];
  partial[threadIdx.x] = mine;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] = max_with_nan(partial[threadIdx.x], partial[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    history_out[0] = newest;
    write_scale(partial[0], fp8_max, margin, scale, descale);
  }
}

// --- input checks: each names the field, the value and the requirement, before anything is enqueued

bool is_16_bit(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

void require_dtype(const char* field, DType dtype, bool ok, const char* requirement) {
  if (!ok) throw InvalidArgument(field, to_string(dtype), requirement);
}

void require_pointer(const char* field, const void* pointer, const char* requirement) {
  if (pointer == nullptr) throw InvalidArgument(field, "null", requirement);
}

void require_tensor(const char* field, const TensorDesc& desc) {
  for (int axis = 0; axis < 4; ++axis) {
    if (desc.dims[axis] < 0) throw InvalidArgument(field, to_string(desc), "dims must not be negative");
  }
  if (desc.elements() > 0 && desc.ragged()) {
    throw InvalidArgument(field, to_string(desc),
                          "must not be ragged (batch stride 0): its run-time offsets are not taken here; pass "
                          "the packed tokens as one dense entry [1, h, tokens, d]");
  }
}

void require_same_dims(const TensorDesc& src_desc, const TensorDesc& dst_desc) {
  if (src_desc.dims != dst_desc.dims) {
    throw InvalidArgument("dst_desc.dims", to_string(dst_desc),
                          "must equal src_desc's dims (" + to_string(src_desc) + ")");
  }
}

void require_fp8(DType dtype) { require_dtype("dtype", dtype, is_fp8(dtype), "must be e4m3 or e5m2"); }

void zero_amax(float* amax, cudaStream_t stream) {
  detail::check_cuda(cudaMemsetAsync(amax, 0, sizeof(float), stream), "cudaMemsetAsync(amax)");
}

template <class T>
void launch_amax(const TensorDesc& desc, const void* data, float* amax, cudaStream_t stream) {
  const std::int64_t n = desc.elements();
  amax_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(make_strided(desc), n, static_cast<const T*>(data),
                                                      reinterpret_cast<unsigned int*>(amax));
  detail::check_cuda(cudaGetLastError(), "measure_amax's kernel launch");
}

template <class Src, class Dst>
void launch_quantize(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                     const float* scale, float* amax, cudaStream_t stream) {
  const std::int64_t n = src_desc.elements();
  quantize_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(make_strided(src_desc), make_strided(dst_desc), n,
                                                          static_cast<const Src*>(src), static_cast<Dst*>(dst), scale,
                                                          reinterpret_cast<unsigned int*>(amax));
  detail::check_cuda(cudaGetLastError(), "quantize_fp8's kernel launch");
}

template <class Src, class Dst>
void launch_dequantize(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                       const float* descale, cudaStream_t stream) {
  const std::int64_t n = src_desc.elements();
  dequantize_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(make_strided(src_desc), make_strided(dst_desc), n,
                                                            static_cast<const Src*>(src), static_cast<Dst*>(dst),
                                                            descale);
  detail::check_cuda(cudaGetLastError(), "dequantize_fp8's kernel launch");
}

}  // namespace

void measure_amax(const TensorDesc& desc, const void* data, float* amax, cudaStream_t stream) {
  require_tensor("desc", desc);
  require_pointer("amax", amax, "must point to a float32 in device memory");
  if (desc.elements() > 0) require_pointer("data", data, "must point to the tensor in device memory");
  zero_amax(amax, stream);
  if (desc.elements() == 0) return;
  switch (desc.dtype) {
    case DType::f16: return launch_amax<__half>(desc, data, amax, stream);
    case DType::bf16: return launch_amax<__nv_bfloat16>(desc, data, amax, stream);
    case DType::e4m3: return launch_amax<E4M3>(desc, data, amax, stream);
    case DType::e5m2: return launch_amax<E5M2>(desc, data, amax, stream);
  }
}

void quantize_fp8(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                  const float* scale, float* amax, cudaStream_t stream) {
  require_dtype("src_desc.dtype", src_desc.dtype, is_16_bit(src_desc.dtype), "must be f16 or bf16 to quantize");
  require_dtype("dst_desc.dtype", dst_desc.dtype, is_fp8(dst_desc.dtype), "must be e4m3 or e5m2 to quantize into");
  require_same_dims(src_desc, dst_desc);
  require_tensor("src_desc", src_desc);
  require_tensor("dst_desc", dst_desc);
  require_pointer("scale", scale, "must point to a float32 in device memory");
  if (src_desc.elements() > 0) {
    require_pointer("src", src, "must point to the tensor in device memory");
    require_pointer("dst", dst, "must point to the tensor in device memory");
  }
  if (amax != nullptr) zero_amax(amax, stream);
  if (src_desc.elements() == 0) return;
  const bool e4m3 = dst_desc.dtype == DType::e4m3;
  if (src_desc.dtype == DType::bf16) {
    if (e4m3) return launch_quantize<__nv_bfloat16, E4M3>(src_desc, src, dst_desc, dst, scale, amax, stream);
    return launch_quantize<__nv_bfloat16, E5M2>(src_desc, src, dst_desc, dst, scale, amax, stream);
  }
  if (e4m3) return launch_quantize<__half, E4M3>(src_desc, src, dst_desc, dst, scale, amax, stream);
  launch_quantize<__half, E5M2>(src_desc, src, dst_desc, dst, scale, amax, stream);
}

void dequantize_fp8(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                    const float* descale, cudaStream_t stream) {
  require_dtype("src_desc.dtype", src_desc.dtype, is_fp8(src_desc.dtype), "must be e4m3 or e5m2 to dequantize");
  require_dtype("dst_desc.dtype", dst_desc.dtype, is_16_bit(dst_desc.dtype), "must be f16 or bf16 to dequantize into");
  require_same_dims(src_desc, dst_desc);
  require_tensor("src_desc", src_desc);
  require_tensor("dst_desc", dst_desc);
  require_pointer("descale", descale, "must point to a float32 in device memory");
  if (src_desc.elements() == 0) return;
  require_pointer("src", src, "must point to the tensor in device memory");
  require_pointer("dst", dst, "must point to the tensor in device memory");
  const bool e4m3 = src_desc.dtype == DType::e4m3;
  if (dst_desc.dtype == DType::bf16) {
    if (e4m3) return launch_dequantize<E4M3, __nv_bfloat16>(src_desc, src, dst_desc, dst, descale, stream);
    return launch_dequantize<E5M2, __nv_bfloat16>(src_desc, src, dst_desc, dst, descale, stream);
  }
  if (e4m3) return launch_dequantize<E4M3, __half>(src_desc, src, dst_desc, dst, descale, stream);
  launch_dequantize<E5M2, __half>(src_desc, src, dst_desc, dst, descale, stream);
}

void scale_from_amax(const float* amax, DType dtype, int margin, float* scale, float* descale, cudaStream_t stream) {
  require_fp8(dtype);
  require_pointer("amax", amax, "must point to a float32 in device memory");
  require_pointer("scale", scale, "must point to a float32 in device memory");
  require_pointer("descale", descale, "must point to a float32 in device memory");
  scale_from_amax_kernel<<<1, 1, 0, stream>>>(amax, fp8_max(dtype), margin, scale, descale);
  detail::check_cuda(cudaGetLastError(), "scale_from_amax's kernel launch");
}

void update_delayed_scaling(const float* history_in, float* history_out, std::int64_t length, const float* amax,
                            DType dtype, int margin, float* scale, float* descale, cudaStream_t stream) {
  require_fp8(dtype);
  if (length < 1) throw InvalidArgument("length", std::to_string(length), "must be at least 1");
  require_pointer("history_in", history_in, "must point to float32 [length] in device memory");
  require_pointer("history_out", history_out, "must point to float32 [length] in device memory");
  require_pointer("amax", amax, "must point to a float32 in device memory");
  require_pointer("scale", scale, "must point to a float32 in device memory");
  require_pointer("descale", descale, "must point to a float32 in device memory");
  delayed_scaling_kernel<<<1, kThreads, 0, stream>>>(history_in, history_out, length, amax, fp8_max(dtype), margin,
                                                    scale, descale);
  detail::check_cuda(cudaGetLastError(), "update_delayed_scaling's kernel launch");
}

}  // namespace fusedattn
