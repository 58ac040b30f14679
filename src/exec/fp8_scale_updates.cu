// FP8 per-tensor scaling on the device, the recipes' steps of fusedattn/fp8.h: a scale and its
// descale from an amax (current scaling), delayed scaling's history shift and scale, and a step's
// updates of several tensors in one launch (update_fp8_scales; the one-tensor calls are its
// one-update case).
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

// An update as the kernel takes it: fp8_max in place of the dtype.
struct DeviceUpdate {
  const float* amax;
  const float* history_in;
  float* history_out;
  std::int64_t length;
  float* scale;
  float* descale;
  float* descale_used;
  float fp8_max;
  int margin;
  Fp8ScaleRule rule;
};

struct DeviceUpdates {
  DeviceUpdate update[kMaxScaleUpdates];
};

// fp8_max / (amax * 2^margin), or 1 where the amax is not a positive finite number. A scale past
// float's range is clamped into it, so that descale = 1 / scale stays finite and non-zero.
__device__ void write_scale(float amax, float fp8_max, int margin, float* scale, float* descale) {
  float s = 1.0f;
  if (amax > 0.0f && isfinite(amax)) s = fminf(fmaxf(ldexpf(fp8_max / amax, -margin), FLT_MIN), FLT_MAX);
  *scale = s;
  *descale = 1.0f / s;
}

// NaN wins, so that a NaN amax anywhere in the history shows (as scale 1, by write_scale).
__device__ float max_with_nan(float a, float b) { return (isnan(a) || a > b) ? a : b; }

// The whole block. The history shifts in chunks of kThreads slots from the top down: each chunk
// reads all its sources before the barrier and writes after it, and its sources lie below every
// slot a higher chunk wrote, so in place and out of place run the same code.
__device__ void delayed_step(const DeviceUpdate& u, float* partial) {
  const float newest = *u.amax;  // read before any barrier, so before any write to the history
  float mine = threadIdx.x == 0 ? newest : 0.0f;
  for (std::int64_t top = u.length; top > 1; top -= kThreads) {
    const std::int64_t slot = top - 1 - threadIdx.x;
    float moved = 0.0f;
    if (slot >= 1) {
      moved = u.history_in[slot - 1];
      mine = max_with_nan(mine, moved);
    }
    __syncthreads();
    if (slot >= 1) u.history_out[slot] = moved;
  }
  partial[threadIdx.x] = mine;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] = max_with_nan(partial[threadIdx.x], partial[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    u.history_out[0] = newest;
    write_scale(partial[0], u.fp8_max, u.margin, u.scale, u.descale);
  }
}

// One block runs the updates in order, a barrier after each, so that an update sees what the
// earlier ones wrote.
__global__ void scale_updates_kernel(DeviceUpdates updates, int count) {
  __shared__ float partial[kThreads];
  for (int i = 0; i < count; ++i) {
    const DeviceUpdate& u = updates.update[i];
    if (threadIdx.x == 0 && u.descale_used != nullptr) *u.descale_used = *u.descale;
    __syncthreads();  // the old descale is read before anything replaces it
    if (u.rule == Fp8ScaleRule::delayed) {
      delayed_step(u, partial);
    } else if (u.rule == Fp8ScaleRule::from_amax && threadIdx.x == 0) {
      write_scale(*u.amax, u.fp8_max, u.margin, u.scale, u.descale);
    }
    __syncthreads();
  }
}

std::string field(int index, const char* name) {
  return index < 0 ? std::string(name) : "updates[" + std::to_string(index) + "]." + name;
}

void require_pointer(const std::string& field, const void* pointer, const char* requirement) {
  if (pointer == nullptr) throw InvalidArgument(field, "null", requirement);
}

constexpr const char* kScalar = "must point to a float32 in device memory";

// `index` -1 for the one-update calls, whose fields are their parameters' names.
DeviceUpdate checked(const Fp8ScaleUpdate& u, int index) {
  if (!is_fp8(u.dtype)) throw InvalidArgument(field(index, "dtype"), to_string(u.dtype), "must be e4m3 or e5m2");
  if (u.rule != Fp8ScaleRule::keep) {
    require_pointer(field(index, "amax"), u.amax, kScalar);
    require_pointer(field(index, "scale"), u.scale, kScalar);
  }
  require_pointer(field(index, "descale"), u.descale, kScalar);
  if (u.rule == Fp8ScaleRule::delayed) {
    if (u.length < 1) throw InvalidArgument(field(index, "length"), std::to_string(u.length), "must be at least 1");
    require_pointer(field(index, "history_in"), u.history_in, "must point to float32 [length] in device memory");
    require_pointer(field(index, "history_out"), u.history_out, "must point to float32 [length] in device memory");
  }
  if (u.rule == Fp8ScaleRule::keep && u.descale_used == nullptr) {
    throw InvalidArgument(field(index, "descale_used"), "null", "must point to a float32 for a keep update "
                                                                "(it only reports its descale)");
  }
  return DeviceUpdate{u.amax, u.history_in, u.history_out, u.length, u.scale, u.descale, u.descale_used,
                      fp8_max(u.dtype), u.margin, u.rule};
}

void launch(const Fp8ScaleUpdate* updates, int count, bool named_by_index, cudaStream_t stream) {
  if (count < 0 || count > kMaxScaleUpdates) {
    throw InvalidArgument("count", std::to_string(count), "must be 0 to " + std::to_string(kMaxScaleUpdates));
  }
  if (count > 0) require_pointer("updates", updates, "must point to `count` updates");
  DeviceUpdates device{};
  for (int i = 0; i < count; ++i) device.update[i] = checked(updates[i], named_by_index ? i : -1);
  if (count == 0) return;
  scale_updates_kernel<<<1, kThreads, 0, stream>>>(device, count);
  detail::check_cuda(cudaGetLastError(), "update_fp8_scales's kernel launch");
}

}  // namespace

void update_fp8_scales(const Fp8ScaleUpdate* updates, int count, cudaStream_t stream) {
  launch(updates, count, /*named_by_index=*/true, stream);
}

void scale_from_amax(const float* amax, DType dtype, int margin, float* scale, float* descale, cudaStream_t stream) {
  const Fp8ScaleUpdate one{Fp8ScaleRule::from_amax, amax, nullptr, nullptr, 0, dtype, margin, scale, descale, nullptr};
  launch(&one, 1, /*named_by_index=*/false, stream);
}

void update_delayed_scaling(const float* history_in, float* history_out, std::int64_t length, const float* amax,
                            DType dtype, int margin, float* scale, float* descale, cudaStream_t stream) {
  const Fp8ScaleUpdate one{Fp8ScaleRule::delayed, amax, history_in, history_out, length, dtype, margin, scale, descale,
                           nullptr};
  launch(&one, 1, /*named_by_index=*/false, stream);
}

}  // namespace fusedattn
