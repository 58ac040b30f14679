// Internal: turns failing CUDA runtime and cuDNN status codes into the library's exceptions.
#pragma once

#include <string>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "fusedattn/errors.h"

namespace fusedattn::detail {

inline void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw CudaError(std::string(call) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
}

inline void check_cudnn(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw CudnnError(std::string(call) + " failed: " + cudnnGetErrorString(status));
  }
}

}  // namespace fusedattn::detail
