// Tier 1: paged K/V caches — the spec string's page keys, and the support policy.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/support.h"
#include "made_up_versions.h"

namespace fusedattn {
namespace {

const char* const kDecode =
    "layout=bshd_paged_sbhd dtype=bf16 b=4 s_q=1 s_kv=4096 h_q=32 h_kv=8 d_qk=128 d_v=128 page_size=64 pages=300 "
    "window=-1,0 align=bottom_right";

TEST(PagedSpec, ShortFormRoundTripsAndSaysThePool) {
  const AttentionSpec spec = parse_spec(kDecode);
  EXPECT_TRUE(spec.paged_kv());
  EXPECT_EQ(spec.kv_pages, 64);
  EXPECT_EQ(spec.page_size(), 64);
  EXPECT_EQ(spec.seq_kv(), 4096);
  EXPECT_EQ(spec.k.batch(), 300);  // the pool's pages
  EXPECT_TRUE(spec.padding);
  EXPECT_EQ(to_string(spec), kDecode);
  EXPECT_NO_THROW(validate(spec));
}

TEST(PagedSpec, PageKeysBelongToPagedLayouts) {
  try {
    parse_spec("layout=bshd b=1 s=64 h=1 d=64 page_size=16 pages=4");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "page_size");
    EXPECT_NE(e.requirement().find("a paged layout"), std::string::npos);
  }
  try {
    parse_spec("layout=bshd_paged_bshd b=1 s=64 h=1 d=64 page_size=16");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "pages");
  }
}

TEST(PagedPolicy, ForwardOnlyFromCudnn9_5) {
  const AttentionSpec spec = parse_spec(kDecode);
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, DeviceCaps{9, 0}, made_up_versions(91900)).ok());
  const Support backward = check_support_policy(spec, Pass::backward, DeviceCaps{9, 0}, made_up_versions(91900));
  ASSERT_EQ(backward.reasons.size(), 1u);
  EXPECT_EQ(backward.reasons[0].field, "kv_pages");
  EXPECT_NE(backward.reasons[0].requirement.find("inference only"), std::string::npos);
  const Support old = check_support_policy(spec, Pass::forward, DeviceCaps{9, 0}, made_up_versions(90400));
  std::set<std::string> lifted;
  for (const Reason& reason : old.reasons) lifted.insert(reason.lifted_by);
  EXPECT_EQ(lifted, (std::set<std::string>{"cuDNN 9.5", "cuDNN 9.6"}));  // paging, and the bottom-right diagonal
  AttentionSpec wide = parse_spec(
      "layout=bshd_paged_bshd dtype=bf16 b=2 s_q=1 s_kv=256 h=4 d=256 page_size=64 pages=8");
  const Support before_9_10 = check_support_policy(wide, Pass::forward, DeviceCaps{9, 0}, made_up_versions(90900));
  ASSERT_EQ(before_9_10.reasons.size(), 1u) << before_9_10.to_string();
  EXPECT_EQ(before_9_10.reasons[0].lifted_by, "cuDNN 9.10");
}

TEST(PagedPolicy, RaggedQueriesFromCudnn9_7AndScoreFeaturesNotYet) {
  AttentionSpec spec = parse_spec(
      "layout=thd_paged_bshd dtype=bf16 b=4 s_q=16 s_kv=1024 h_q=8 h_kv=2 d=128 page_size=64 pages=80");
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, DeviceCaps{9, 0}, made_up_versions(91900)).ok());
  const Support old = check_support_policy(spec, Pass::forward, DeviceCaps{9, 0}, made_up_versions(90600));
  ASSERT_EQ(old.reasons.size(), 1u) << old.to_string();
  EXPECT_EQ(old.reasons[0].lifted_by, "cuDNN 9.7");
  spec.softmax = Softmax::sink;
  const Support support = check_support_policy(spec, Pass::forward, DeviceCaps{9, 0}, made_up_versions(91900));
  std::set<std::string> fields;
  for (const Reason& reason : support.reasons) fields.insert(reason.field);
  EXPECT_EQ(fields, (std::set<std::string>{"softmax"})) << support.to_string();  // said for ragged and for paged
}

}  // namespace
}  // namespace fusedattn
