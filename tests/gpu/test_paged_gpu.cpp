// GPU tier: paged K/V caches — decode and short prefills (1 and 2..16 query tokens a sequence,
// bottom-right causal) over pools in bshd and sbhd pages, with bshd, sbhd or thd queries, against the
// reference on the gathered K/V (the checker copies each sequence's pages to shuffled pool pages).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fusedattn/spec.h"
#include "gpu_skip.h"
#include "supported_passes.h"

namespace fusedattn {
namespace {

struct Case {
  std::string name, spec;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.spec; }

std::vector<Case> paged_cases() {
  std::vector<Case> out;
  const char* layouts[] = {"bshd_paged_bshd", "bshd_paged_sbhd", "sbhd_paged_bshd", "sbhd_paged_sbhd"};
  for (const char* layout : layouts) {
    const std::string base = std::string("layout=") + layout + " dtype=bf16 h_q=32 h_kv=8 d=128 causal align=bottom_right";
    out.push_back({std::string(layout) + "_decode_page64", base + " b=8 s_q=1 s_kv=2048 page_size=64 pages=300"});
    out.push_back({std::string(layout) + "_q7_page16", base + " b=4 s_q=7 s_kv=1024 page_size=16 pages=300"});
  }
  out.push_back({"decode_page128_f16",
                 "layout=bshd_paged_bshd dtype=f16 b=3 s_q=1 s_kv=4096 h_q=16 h_kv=2 d=64 page_size=128 pages=100 "
                 "causal align=bottom_right"});
  out.push_back({"q16_page32_bf16",
                 "layout=bshd_paged_sbhd dtype=bf16 b=2 s_q=16 s_kv=512 h_q=8 h_kv=1 d=128 page_size=32 pages=40 "
                 "causal align=bottom_right"});
  out.push_back({"page_size_1_bf16", "layout=bshd_paged_bshd dtype=bf16 b=2 s_q=1 s_kv=96 h=4 d=64 page_size=1 pages=200"});
  for (const char* layout : {"thd_paged_bshd", "thd_paged_sbhd"}) {  // ragged queries, 1..16 a sequence
    out.push_back({std::string(layout) + "_q16_page64",
                   std::string("layout=") + layout + " dtype=bf16 b=5 s_q=16 s_kv=1024 h_q=16 h_kv=4 d=128 "
                   "page_size=64 pages=100 causal align=bottom_right"});
  }
  out.push_back({"no_mask_prefill_bf16",
                 "layout=sbhd_paged_bshd dtype=bf16 b=2 s_q=100 s_kv=256 h_q=8 h_kv=2 d=128 page_size=64 pages=12"});
  return out;
}

class PagedNumerics : public ::testing::TestWithParam<Case> {};

TEST_P(PagedNumerics, MatchesReferenceOnGatheredKv) {
  FUSEDATTN_REQUIRE_GPU();
  check_supported_passes(parse_spec(GetParam().spec), /*inference=*/true);
}

INSTANTIATE_TEST_SUITE_P(Gpu, PagedNumerics, ::testing::ValuesIn(paged_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace fusedattn
