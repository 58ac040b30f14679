// Failures and refusals among cuDNN's build answers (cudnn_status.h).
#include "support/cudnn_status.h"

namespace fusedattn::detail {

std::string_view cudnn_failure_in(std::string_view message) noexcept {
  // cuDNN 9's status names (cudnn_graph.h) for conditions of the process, not of the graph. A
  // prefix covers a family: EXECUTION_FAILED_CUDA_DRIVER, _CUDART, ...; the allocation failures
  // are the only INTERNAL_ERROR_* members here, as the others follow from the graph.
  static constexpr std::string_view kFailures[] = {
      "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
      "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
      "CUDNN_STATUS_EXECUTION_FAILED",
      "CUDNN_STATUS_NOT_INITIALIZED",
      "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
      "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
      "CUDNN_STATUS_LICENSE_ERROR",
  };
  // Only a line's own status counts, not the text after its "Reason:", which is the source of the
  // check that failed and names statuses in passing: an engine that refuses a graph reports
  // "Warning: CUDNN_STATUS_NOT_SUPPORTED; Reason: (CUDNN_STATUS_NOT_INITIALIZED == status) || ...".
  for (std::size_t line = 0; line < message.size();) {
    std::size_t stop = message.find('\n', line);
    if (stop == std::string_view::npos) stop = message.size();
    std::string_view own = message.substr(line, stop - line);
    own = own.substr(0, own.find("Reason:"));
    for (std::string_view failure : kFailures) {
      const std::size_t at = own.find(failure);
      if (at == std::string_view::npos) continue;
      std::size_t end = at + failure.size();
      while (end < own.size() && (own[end] == '_' || (own[end] >= 'A' && own[end] <= 'Z'))) ++end;
      return own.substr(at, end - at);
    }
    line = stop + 1;
  }
  return {};
}

}  // namespace fusedattn::detail
