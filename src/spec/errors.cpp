// Names of error kinds, for logs, the CLI and the Python exception mapping.
#include "fusedattn/errors.h"

namespace fusedattn {

const char* to_string(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::invalid_argument: return "invalid_argument";
    case ErrorKind::not_supported: return "not_supported";
    case ErrorKind::cudnn: return "cudnn_error";
    case ErrorKind::cuda: return "cuda_error";
    case ErrorKind::setup: return "setup_error";
  }
  return "unknown";
}

}  // namespace fusedattn
