// GPU tier: every combination of the support report (docs/support-matrix.md) that this GPU and
// cuDNN support runs against the reference, so each "yes" in the report is a checked one. The
// combinations are the report's own (tools/support_matrix.h), at a smaller size with the same
// graph structure.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "supported_passes.h"
#include "tools/support_matrix.h"

namespace fusedattn {
namespace {

struct Entry {
  std::string name;
  AttentionSpec spec;
};

void PrintTo(const Entry& entry, std::ostream* os) { *os << to_string(entry.spec); }

std::string test_name(const std::vector<std::string>& labels) {
  std::string name;
  for (const std::string& label : labels) {
    if (!name.empty()) name += "_";
    for (char c : label) {
      const bool keep = std::isalnum(static_cast<unsigned char>(c));
      if (keep || (!name.empty() && name.back() != '_')) name += keep ? c : '_';
    }
  }
  return name;
}

std::vector<Entry> entries() {
  std::vector<Entry> out;
  for (const auto& list : {tools::feature_entries(tools::kCheckSize), tools::layout_entries(tools::kCheckSize)}) {
    for (const tools::MatrixEntry& entry : list) out.push_back({test_name(entry.labels), entry.spec});
  }
  return out;
}

class SupportMatrix : public ::testing::TestWithParam<Entry> {};

TEST_P(SupportMatrix, SupportedMeansCorrect) {
  FUSEDATTN_REQUIRE_GPU();
  check_supported_passes(GetParam().spec);
}

INSTANTIATE_TEST_SUITE_P(Gpu, SupportMatrix, ::testing::ValuesIn(entries()),
                         [](const ::testing::TestParamInfo<Entry>& info) { return info.param.name; });

}  // namespace
}  // namespace fusedattn
