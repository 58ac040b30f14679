// GPU tier: skip a test, saying why, when this machine has no usable CUDA device, or when the
// support policy refuses the case for a known fault of the loaded cuDNN alone.
#pragma once

#include <algorithm>
#include <string>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "fusedattn/support.h"

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

/// Whether `answer` refuses only for the loaded cuDNN (every reason's field "cudnn": a version with a
/// known wrong result, docs/reliability.md), as when the GPU tiers run under another cuDNN than the
/// pinned one: the case is not this build's to run there, and the test skips with the reasons.
inline bool refused_for_the_loaded_cudnn(const Support& answer) {
  return !answer.ok() && std::all_of(answer.reasons.begin(), answer.reasons.end(),
                                     [](const Reason& reason) { return reason.field == "cudnn"; });
}

}  // namespace fusedattn

/// First statement of every GPU test: skips with the reason when there is no GPU.
#define FUSEDATTN_REQUIRE_GPU()                                                 \
  do {                                                                          \
    if (auto fusedattn_no_gpu = ::fusedattn::no_gpu_reason(); !fusedattn_no_gpu.empty()) \
      GTEST_SKIP() << fusedattn_no_gpu;                                         \
  } while (0)
