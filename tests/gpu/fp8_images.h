// GPU tier helpers for the FP8 element kernels' tests: fresh random inputs, [b, h, s, d] views of
// the usual layouts, host images of strided tensors (poison where no element lives) and their
// elements through the host codecs, and device buffers in and out.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "device_copy.h"
#include "fusedattn/fp8.h"
#include "fusedattn/reference.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"

namespace fusedattn::fp8_test {

using check::check_cuda;
using check::DeviceBuffer;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr std::uint8_t kPoison = 0xa5;  // a finite value in both FP8 types; never what a kernel writes here

// Fresh inputs on every run; the seed goes into every failure so it can be replayed.
struct Rng {
  unsigned seed = std::random_device{}();
  std::mt19937 engine{seed};
  std::string trace() const { return "random seed " + std::to_string(seed); }
  std::vector<float> normal(std::int64_t n, float sigma) {
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> out(static_cast<std::size_t>(n));
    for (float& x : out) x = dist(engine);
    return out;
  }
};

inline std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float float_of(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Same float, bit for bit (so -0.0 differs from 0.0), or both NaN.
inline bool same_float(float a, float b) { return bits_of(a) == bits_of(b) || (std::isnan(a) && std::isnan(b)); }

inline TensorDesc make_desc(DType dtype, std::array<std::int64_t, 4> dims, std::array<std::int64_t, 4> strides) {
  TensorDesc desc;
  desc.dtype = dtype;
  desc.dims = dims;
  desc.strides = strides;
  return desc;
}

// [b, h, s, d] views of memory laid out as [b, s, h, d], [s, b, h, d] and [b, h, s, d].
inline TensorDesc bshd(DType dtype, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
  return make_desc(dtype, {b, h, s, d}, {s * h * d, d, h * d, 1});
}
inline TensorDesc sbhd(DType dtype, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
  return make_desc(dtype, {b, h, s, d}, {h * d, d, b * h * d, 1});
}
inline TensorDesc bhsd(DType dtype, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
  return make_desc(dtype, {b, h, s, d}, contiguous_bhsd_strides({b, h, s, d}));
}

inline std::int64_t offset_of(const TensorDesc& desc, std::int64_t n) {
  std::int64_t offset = 0;
  for (int axis = 3; axis >= 0; --axis) {
    offset += (n % desc.dims[axis]) * desc.strides[axis];
    n /= desc.dims[axis];
  }
  return offset;
}

// The bytes of a strided tensor on the host, poison wherever no element lives, and its elements
// by logical index as bit patterns (16-bit or FP8, as the dtype says) or as floats.
struct HostImage {
  TensorDesc desc;
  std::vector<std::uint8_t> bytes;

  explicit HostImage(const TensorDesc& d) : desc(d), bytes(bytes_of(d), kPoison) {}
  std::uint32_t bits(std::int64_t n) const {
    const std::size_t at = static_cast<std::size_t>(offset_of(desc, n)) * size_of(desc.dtype);
    if (size_of(desc.dtype) == 1) return bytes[at];
    std::uint16_t half;
    std::memcpy(&half, &bytes[at], sizeof half);
    return half;
  }
  void set_bits(std::int64_t n, std::uint32_t bits) {
    const std::size_t at = static_cast<std::size_t>(offset_of(desc, n)) * size_of(desc.dtype);
    if (size_of(desc.dtype) == 1) {
      bytes[at] = static_cast<std::uint8_t>(bits);
    } else {
      const auto half = static_cast<std::uint16_t>(bits);
      std::memcpy(&bytes[at], &half, sizeof half);
    }
  }
  float value(std::int64_t n) const {
    if (is_fp8(desc.dtype)) return fp8_bits_to_float(static_cast<std::uint8_t>(bits(n)), desc.dtype);
    return half_bits_to_float(static_cast<std::uint16_t>(bits(n)), desc.dtype);
  }
  // Rounds `value` to the dtype, as the host codecs do.
  void set_value(std::int64_t n, float value) {
    set_bits(n, is_fp8(desc.dtype) ? float_to_fp8_bits(value, desc.dtype) : float_to_half_bits(value, desc.dtype));
  }
  // Every byte no element covers still holds the poison.
  void expect_gaps_untouched(const std::vector<std::uint8_t>& device_bytes) const {
    std::vector<bool> covered(bytes.size(), false);
    for (std::int64_t n = 0; n < desc.elements(); ++n) {
      const std::size_t at = static_cast<std::size_t>(offset_of(desc, n)) * size_of(desc.dtype);
      for (std::size_t k = 0; k < size_of(desc.dtype); ++k) covered[at + k] = true;
    }
    for (std::size_t at = 0; at < bytes.size(); ++at) {
      if (!covered[at]) ASSERT_EQ(device_bytes[at], kPoison) << "byte " << at << " outside the tensor was written";
    }
  }
};

inline DeviceBuffer upload(const void* host, std::size_t bytes) {
  DeviceBuffer device(bytes);
  check_cuda(cudaMemcpy(device.get(), host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(upload)");
  return device;
}
inline DeviceBuffer upload(const std::vector<std::uint8_t>& bytes) { return upload(bytes.data(), bytes.size()); }
inline DeviceBuffer upload(const std::vector<float>& values) { return upload(values.data(), values.size() * sizeof(float)); }

inline std::vector<float> download_floats(const DeviceBuffer& device) {
  std::vector<float> out(device.bytes() / sizeof(float));
  check_cuda(cudaMemcpy(out.data(), device.get(), device.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy(download)");
  return out;
}

// One float scalar in device memory, poisoned with NaN's all-ones pattern until written.
inline DeviceBuffer poisoned_scalar() {
  DeviceBuffer device(sizeof(float));
  check_cuda(cudaMemset(device.get(), 0xff, sizeof(float)), "cudaMemset(poison)");
  return device;
}

inline float download_scalar(const DeviceBuffer& device) { return download_floats(device).at(0); }

inline void synchronize() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

inline float host_amax(const HostImage& image) {
  float best = 0.0f;
  for (std::int64_t n = 0; n < image.desc.elements(); ++n) {
    const float magnitude = std::fabs(image.value(n));
    if (std::isnan(magnitude)) return kNan;
    best = std::fmax(best, magnitude);
  }
  return best;
}

}  // namespace fusedattn::fp8_test
