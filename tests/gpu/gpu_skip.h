// GPU tier: skip a test, saying why, when this machine has no usable CUDA device.
#pragma once

#include <string>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

namespace fusedattn {

/// "" when a CUDA device is usable, otherwise the reason, for the skip message.
inline std::string no_gpu_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return "";
  (void)cudaGetLastError();  // clear it, so that the next CUDA check does not report it again
  if (status == cudaSuccess) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  return std::string("no CUDA device: ") + cudaGetErrorString(status);
}

}  // namespace fusedattn

/// First statement of every GPU test: skips with the reason when there is no GPU.
#define FUSEDATTN_REQUIRE_GPU()                                                 \
  do {                                                                          \
    if (auto fusedattn_no_gpu = ::fusedattn::no_gpu_reason(); !fusedattn_no_gpu.empty()) \
      GTEST_SKIP() << fusedattn_no_gpu;                                         \
  } while (0)
