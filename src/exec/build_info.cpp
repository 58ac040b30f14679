// build_info(): versions compiled in and loaded, and the GPU, for the first line of every log.
#include "fusedattn/build_info.h"

#include <string>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "fusedattn/errors.h"
#include "graph/sdpa_graph.h"

#ifndef FUSEDATTN_VERSION
#define FUSEDATTN_VERSION "unknown"
#endif

namespace fusedattn {
namespace {

// Plain std::to_string, not iostreams: the library is loaded into framework processes where it
// should touch as little of the C++ runtime's shared state (locales, facets) as it can.
std::string dotted(int v, int major_unit) {  // 91900 -> "9.19.0", 13200 -> "1.32.0"
  return std::to_string(v / major_unit) + "." + std::to_string((v % major_unit) / 100) + "." + std::to_string(v % 100);
}

}  // namespace

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
    info.gpu_unavailable_reason = status != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status)
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
  std::string out = "fusedattn " + version + "\n" + "cuDNN compiled " + dotted(cudnn_compiled, 10000) + ", loaded " +
                    dotted(cudnn_runtime, 10000) + "; cuDNN frontend " + dotted(frontend, 10000) + "\n" +
                    "CUDA runtime " + cuda(cuda_runtime) + ", driver " + cuda(cuda_driver) + "\n";
  if (device_count == 0) return out + "GPU: none (" + gpu_unavailable_reason + ")";
  return out + "GPU: " + device_name + " (SM " + std::to_string(sm / 10) + "." + std::to_string(sm % 10) + "), " +
         std::to_string(device_count) + " visible";
}

void require_matching_cudnn() {
  int runtime = static_cast<int>(cudnnGetVersion());
  if (runtime / 10000 != CUDNN_VERSION / 10000) {
    throw SetupError("cuDNN version mismatch: built against " + dotted(CUDNN_VERSION, 10000) + ", loaded " +
                     dotted(runtime, 10000) + "; put the matching libcudnn.so.9 first on the library path");
  }
}

}  // namespace fusedattn
