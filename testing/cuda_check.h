// testing/cuda_check.h — a CUDA runtime status turned into fusedattn's CudaError, for test tooling.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "fusedattn/errors.h"

namespace fusedattn::check {

/// Throws CudaError "<call> failed: <error name> (<description>)" when `status` is not cudaSuccess.
inline void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  // Reset the (non-sticky) last-error state so that a later cudaGetLastError does not report it again.
  cudaGetLastError();
  throw CudaError(std::string(call) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace fusedattn::check
