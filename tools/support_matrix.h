// tools/support_matrix.h — the support report: check_support over a cross product of features,
// masks, head dims, layouts and dtypes, written as a markdown table (docs/support-matrix.md). The
// same combinations feed the GPU test that runs every supported one against the reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fusedattn/spec.h"

namespace fusedattn::tools {

/// Problem sizes for the combinations; layouts that pack Q with K/V use s_kv = s_q, h_kv = h_q.
struct MatrixSize {
  std::int64_t batch, seq_q, seq_kv, heads_q, heads_kv;
};
/// The report's size, and the smaller one the GPU test checks the same graphs at (s_kv > s_q, a
/// window that binds, GQA, lengths that are not multiples of 64).
constexpr MatrixSize kReportSize{2, 1000, 1500, 16, 4};
constexpr MatrixSize kCheckSize{1, 260, 300, 8, 2};

/// One combination: the row's leading cells, and the spec they stand for.
struct MatrixEntry {
  std::vector<std::string> labels;
  AttentionSpec spec;
};

/// BF16 bshd: every feature x mask x head dims (labels: feature, mask, d_qk/d_v).
std::vector<MatrixEntry> feature_entries(const MatrixSize& size);
/// Causal top-left, d=128: every layout x dtype (labels: layout, dtype).
std::vector<MatrixEntry> layout_entries(const MatrixSize& size);

/// The whole report. With `with_cudnn`, each verdict is check_support on the current GPU (policy
/// and cuDNN's own answer, building and caching every supported plan); without, the pure policy
/// for an SM 9.0 device and the compiled cuDNN version, and the report says so at the top.
/// `progress`, where given, hears after each combination how many are done of how many.
std::string support_matrix_markdown(bool with_cudnn,
                                    const std::function<void(std::size_t done, std::size_t total)>& progress = {});

}  // namespace fusedattn::tools
