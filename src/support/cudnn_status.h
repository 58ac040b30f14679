// Internal: which of cuDNN's answers during a build are refusals and which are failures.
//
// A refusal (NOT_SUPPORTED_*, BAD_PARAM_*, the frontend's own "not supported", and cuDNN's plain
// INTERNAL_ERROR, which it gives for graphs it cannot compile) is the support answer, cached with
// the plan's key and allowed to fall back. A failure (memory exhausted, an execution or CUDA
// failure, a library that is not loaded) says nothing about the configuration: it is raised as
// CudnnError and never cached, so the next call builds again.
#pragma once

#include <string_view>

namespace fusedattn::detail {

/// The first failure status that a cuDNN or frontend message names ("CUDNN_STATUS_EXECUTION_FAILED",
/// "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", ...), or empty when it names none.
std::string_view cudnn_failure_in(std::string_view message) noexcept;

}  // namespace fusedattn::detail
