// build_info(): versions compiled in and loaded, and the GPU, for the first line of every log.
#include "fusedattn/build_info.h"

#include <string>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "exec/cuda_status.h"
#include "fusedattn/errors.h"
#include "fusedattn/support.h"
#include "graph/sdpa_graph.h"

#ifndef FUSEDATTN_VERSION
#define FUSEDATTN_VERSION "unknown"
#endif

namespace fusedattn {
BuildInfo build_info() {
  BuildInfo info;
  info.version = FUSEDATTN_VERSION;
  info.cudnn_compiled = CUDNN_VERSION;
  info.cudnn_runtime = static_cast<int>(cudnnGetVersion());
  info.frontend = graph::frontend_version();
  cudaRuntimeGetVersion(&info.cuda_runtime);
  cudaDriverGetVersion(&info.cuda_driver);
  cudaError_t status = cudaGetDeviceCount(&info.device_count);
  if (status != cudaSuccess || info.device_count == 0) {
    info.device_count = 0;
    info.gpu_unavailable_reason = status != cudaSuccess
                                      ? detail::cuda_failure(status, "cudaGetDeviceCount", info.cuda_driver)
                                      : "no CUDA device visible";
    cudaGetLastError();  // clear the error cudaGetDeviceCount left, so later calls start clean
    return info;
  }
  int device = 0;
  cudaDeviceProp props{};
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&props, device) == cudaSuccess) {
    info.device_name = props.name;
    info.sm = props.major * 10 + props.minor;
  }
  return info;
}

std::string BuildInfo::to_string() const {
  auto cuda = [](int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); };
  std::string out = "fusedattn " + version + "\n" + "cuDNN compiled " + version_text(cudnn_compiled) + ", loaded " +
                    version_text(cudnn_runtime) + "; cuDNN frontend " + version_text(frontend) + "\n" +
                    "CUDA runtime " + cuda(cuda_runtime) + ", driver " + cuda(cuda_driver) + "\n";
  if (device_count == 0) return out + "GPU: none (" + gpu_unavailable_reason + ")";
  return out + "GPU: " + device_name + " (SM " + std::to_string(sm / 10) + "." + std::to_string(sm % 10) + "), " +
         std::to_string(device_count) + " visible";
}

void require_matching_cudnn() {
  int runtime = static_cast<int>(cudnnGetVersion());
  if (runtime / 10000 != CUDNN_VERSION / 10000) {
    throw SetupError("cuDNN version mismatch: built against " + version_text(CUDNN_VERSION) + ", loaded " +
                     version_text(runtime) + "; put the matching libcudnn.so.9 first on the library path");
  }
}

}  // namespace fusedattn
