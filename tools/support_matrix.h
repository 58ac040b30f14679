// tools/support_matrix.h — the support report: check_support over a cross product of features,
// masks, head dims, layouts and dtypes, written as a markdown table (docs/support-matrix.md).
#pragma once

#include <string>

namespace fusedattn::tools {

/// The whole report. With `with_cudnn`, each verdict is check_support on the current GPU (policy
/// and cuDNN's own answer, building and caching every supported plan); without, the pure policy
/// for an SM 9.0 device and the compiled cuDNN version, and the report says so at the top.
std::string support_matrix_markdown(bool with_cudnn);

}  // namespace fusedattn::tools
