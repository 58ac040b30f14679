// Internal: a failing CUDA runtime status in words that say what is wrong. Without a driver the
// runtime reports cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA
// runtime version", which sends people looking for a newer driver when there is none at all.
// Pure (the driver's version is an argument), so the wording is tested without a GPU.
#pragma once

#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

namespace fusedattn::detail {

/// Why there is no GPU to use, from a failing status and cudaDriverGetVersion's answer (0 where no
/// driver library loads): "no NVIDIA driver found" (no driver, whether the runtime said
/// cudaErrorInsufficientDriver or cudaErrorNoDevice), "no CUDA GPU found" (a driver that sees no
/// GPU: cudaErrorNoDevice), or empty for any other status, which the runtime's own words describe.
inline std::string_view gpu_missing(cudaError_t status, int driver_version) noexcept {
  const bool absent = status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice;
  if (absent && driver_version == 0) return "no NVIDIA driver found";
  if (status == cudaErrorNoDevice) return "no CUDA GPU found";
  return {};
}

/// "<call> failed: <why>": gpu_missing's words where they apply, the status's name after them;
/// else the status's name and the runtime's description.
inline std::string cuda_failure(cudaError_t status, const char* call, int driver_version) {
  const std::string_view missing = gpu_missing(status, driver_version);
  const std::string head = std::string(call) + " failed: ";
  if (!missing.empty()) return head + std::string(missing) + " (" + cudaGetErrorName(status) + ")";
  return head + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

}  // namespace fusedattn::detail
