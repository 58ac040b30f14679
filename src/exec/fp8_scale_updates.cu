// FP8 per-tensor scaling on the device, the recipes' steps of fusedattn/fp8.h: a scale and its
// descale from an amax (current scaling), and delayed scaling's history shift and scale.
#include <cfloat>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "exec/cuda_check.h"
#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"

namespace fusedattn {

namespace {

constexpr int kThreads = 256;

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

void require_fp8(DType dtype) {
  if (!is_fp8(dtype)) throw InvalidArgument("dtype", to_string(dtype), "must be e4m3 or e5m2");
}

void require_pointer(const char* field, const void* pointer, const char* requirement) {
  if (pointer == nullptr) throw InvalidArgument(field, "null", requirement);
}

}  // namespace

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
