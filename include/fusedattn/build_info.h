// fusedattn/build_info.h — what this build is and what it is running on; printed first by tests,
// benchmarks and the CLI so every log says which library and GPU produced it.
#pragma once

#include <string>

namespace fusedattn {

struct BuildInfo {
  std::string version;         ///< fusedattn's own version
  int cudnn_compiled = 0;      ///< CUDNN_VERSION of the headers the library was built against
  int cudnn_runtime = 0;       ///< cudnnGetVersion() of the loaded libcudnn (0 if it cannot load)
  int frontend = 0;            ///< cuDNN frontend headers' version
  int cuda_runtime = 0;        ///< cudaRuntimeGetVersion()
  int cuda_driver = 0;         ///< cudaDriverGetVersion() (0 without a driver)
  int device_count = 0;        ///< visible CUDA devices (0 without a GPU)
  std::string device_name;     ///< name of the current device, empty without one
  int sm = 0;                  ///< its compute capability, e.g. 90
  std::string gpu_unavailable_reason;  ///< why no GPU is usable, empty when one is
  std::string to_string() const;       ///< multi-line, human readable
};

/// Never throws: whatever cannot be queried is left at its zero value with the reason noted.
BuildInfo build_info();

/// Throws SetupError when the loaded cuDNN's major version differs from the compiled one.
void require_matching_cudnn();

}  // namespace fusedattn
