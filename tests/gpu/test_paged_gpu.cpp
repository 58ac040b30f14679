// GPU tier: paged K/V caches — decode and short prefills (1 and 2..16 query tokens a sequence,
// bottom-right causal) over pools in bshd and sbhd pages, with bshd, sbhd or thd queries, against the
// reference on the gathered K/V (the checker copies each sequence's pages to shuffled pool pages).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "fusedattn/spec.h"
#include "testing/reference_check.h"
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
  // Split decodes (src/support/decode_split.h; most cases above split too, all but page_size_1 and
  // the prefill): one sequence over long caches, and several queries without a mask.
  out.push_back({"split_b1_8k", "layout=bshd_paged_bshd dtype=bf16 b=1 s_q=1 s_kv=8192 h_q=32 h_kv=8 d=128 "
                                "page_size=64 pages=128 causal align=bottom_right"});
  out.push_back({"split_b2_32k_sbhd", "layout=sbhd_paged_sbhd dtype=bf16 b=2 s_q=1 s_kv=32768 h_q=32 h_kv=8 d=128 "
                                      "page_size=64 pages=1024 causal align=bottom_right"});
  out.push_back({"split_q12_causal", "layout=bshd_paged_bshd dtype=bf16 b=3 s_q=12 s_kv=4096 h_q=16 h_kv=2 d=128 "
                                     "page_size=64 pages=192 causal align=bottom_right"});
  out.push_back({"split_q4_no_mask_f16", "layout=bshd_paged_sbhd dtype=f16 b=2 s_q=4 s_kv=2048 h_q=8 h_kv=2 d=64 "
                                         "page_size=32 pages=128"});
  // Ragged queries split too (the thd cases above, 4 chunks and the masked call): a decode step of
  // one query (10 chunks of 13 pages on an H200) and a speculative one of up to 3 (8 chunks, masked),
  // each with the checker's empty second sequence and its padded starts (gaps to zero).
  out.push_back({"split_thd_decode_8k", "layout=thd_paged_bshd dtype=bf16 b=3 s_q=1 s_kv=8192 h_q=32 h_kv=8 d=128 "
                                        "page_size=64 pages=384 causal align=bottom_right"});
  out.push_back({"split_thd_q3_causal", "layout=thd_paged_sbhd dtype=bf16 b=4 s_q=3 s_kv=2048 h_q=16 h_kv=2 d=128 "
                                        "page_size=64 pages=128 causal align=bottom_right"});
  return out;
}

class PagedNumerics : public ::testing::TestWithParam<Case> {};

TEST_P(PagedNumerics, MatchesReferenceOnGatheredKv) {
  FUSEDATTN_REQUIRE_GPU();
  check_supported_passes(parse_spec(GetParam().spec), /*inference=*/true);
}

INSTANTIATE_TEST_SUITE_P(Gpu, PagedNumerics, ::testing::ValuesIn(paged_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

enum class QueryLengths { given, left_out };

// A paged spec checked against the reference with these lengths (forward only); left_out calls it
// with seq_len_q null, every seq_len_q then being s_q.
void check_with_lengths(const char* spec, std::vector<std::int32_t> seq_len_q, std::vector<std::int32_t> seq_len_kv,
                        QueryLengths query_lengths = QueryLengths::given) {
  check::CheckOptions options;
  options.backward = false;
  options.seq_len_q = std::move(seq_len_q);
  options.seq_len_kv = std::move(seq_len_kv);
  options.forward_without_seq_len_q = query_lengths == QueryLengths::left_out;
  const check::CheckResult result = check::check_against_reference(parse_spec(spec), options);
  std::printf("  %s\n", result.to_string().c_str());
  EXPECT_TRUE(result.passed) << result.to_string();
}

// A split decode's edges, with lengths chosen: an empty sequence, one key, one page, a page
// multiple that ends a chunk exactly, one short of the cache and the whole cache (b = 6 on an H200:
// four chunks of 2048 keys, 4096 ending the second).
TEST(PagedSplitDecode, EmptySequencesOnePageAndPageMultiples) {
  FUSEDATTN_REQUIRE_GPU();
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=6 s_q=1 s_kv=8192 h_q=32 h_kv=8 d=128 page_size=64 "
                     "pages=768 causal align=bottom_right",
                     {1, 1, 1, 1, 1, 1}, {0, 1, 64, 4096, 8191, 8192});
}

// Several causal queries: the keys some query cannot see go to the masked call, from the page
// holding key len - s_q on (64-token pages: 8 queries over 1027 keys leave 960 to the chunks and 67,
// over two pages, to the masked call; 12 over 1036 leave 1024 and 12; 12 over 12 leave all 12).
// h_kv = 2 and 96 folded rows: 4 tiles an entry, 12 for b = 3, so the 32-page cache splits into 8
// chunks of 4 pages on an H200 (decode_split.h).
TEST(PagedSplitDecode, TheMaskedCallTakesTheKeysSomeQueryCannotSee) {
  FUSEDATTN_REQUIRE_GPU();
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=3 s_q=12 s_kv=2048 h_q=16 h_kv=2 d=128 page_size=64 "
                     "pages=96 causal align=bottom_right",
                     {8, 12, 12}, {1027, 1036, 12});
}

// A decode step without seq_len_q (attention.h): the split decode's kernels take every
// sequence's s_q queries, and an unsplit paged or a padded dense forward gets them filled by the
// plan. b = 2 with 8k keys splits on an H200, b = 64 does not; the dense spec never does.
TEST(PagedSplitDecode, QueryLengthsLeftOut) {
  FUSEDATTN_REQUIRE_GPU();
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=2 s_q=1 s_kv=8192 h_q=32 h_kv=8 d=128 page_size=64 "
                     "pages=256 causal align=bottom_right",
                     {1, 1}, {8192, 3001}, QueryLengths::left_out);
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=3 s_q=12 s_kv=2048 h_q=16 h_kv=2 d=128 page_size=64 "
                     "pages=96 causal align=bottom_right",
                     {12, 12, 12}, {1036, 12, 2048}, QueryLengths::left_out);
  const std::vector<std::int32_t> ones(64, 1);
  std::vector<std::int32_t> keys(64);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<std::int32_t>(1 + i * 31);
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=64 s_q=1 s_kv=2048 h_q=32 h_kv=8 d=128 page_size=64 "
                     "pages=2048 causal align=bottom_right",
                     ones, keys, QueryLengths::left_out);
  check_with_lengths("layout=bshd dtype=bf16 b=3 s_q=5 s_kv=300 h_q=8 h_kv=2 d=64 padding=1 causal align=bottom_right",
                     {5, 5, 5}, {300, 7, 120}, QueryLengths::left_out);
}

}  // namespace
}  // namespace fusedattn
