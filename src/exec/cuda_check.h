// Internal: turns failing CUDA runtime and cuDNN status codes into the library's exceptions.
#pragma once

#include <string>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "exec/cuda_status.h"
#include "fusedattn/errors.h"

namespace fusedattn::detail {

inline void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  int driver_version = -1;  // asked only on failure: 0 (no driver at all) changes the words
  cudaDriverGetVersion(&driver_version);
  throw CudaError(cuda_failure(status, call, driver_version));
}

inline void check_cudnn(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw CudnnError(std::string(call) + " failed: " + cudnnGetErrorString(status));
  }
}

}  // namespace fusedattn::detail
