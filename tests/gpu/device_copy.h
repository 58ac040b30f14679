// GPU tier: reading a tensor back from the device, shared by the execution-contract tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "fusedattn/reference.h"
#include "fusedattn/tensor.h"
#include "testing/cuda_check.h"

namespace fusedattn {

/// The bytes at `device`, copied synchronously.
inline std::vector<std::uint8_t> copy_to_host(const void* device, std::size_t bytes) {
  std::vector<std::uint8_t> host(bytes);
  check::check_cuda(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}

/// Bytes a tensor's buffer spans.
inline std::size_t bytes_of(const TensorDesc& desc) {
  return static_cast<std::size_t>(desc.extent()) * size_of(desc.dtype);
}

/// 16-bit floats (bf16 or f16, as `dtype` says) widened to float.
inline std::vector<float> as_floats(const std::vector<std::uint8_t>& bytes, DType dtype) {
  std::vector<float> out(bytes.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    out[i] = half_bits_to_float(bits, dtype);
  }
  return out;
}

}  // namespace fusedattn
