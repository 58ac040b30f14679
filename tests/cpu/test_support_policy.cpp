// Tier 1: the pure support policy on made-up GPUs and cuDNN versions — every reason, with what lifts it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fusedattn/layout.h"
#include "fusedattn/support.h"
#include "made_up_versions.h"

namespace fusedattn {
namespace {

const DeviceCaps kSm75{7, 5}, kSm80{8, 0}, kSm86{8, 6}, kSm90{9, 0}, kSm100{10, 0}, kSm120{12, 0};

Versions cudnn(int runtime) { return made_up_versions(runtime); }
const Versions kCudnn8_9 = cudnn(8907), kCudnn9_5 = cudnn(90500), kCudnn9_9 = cudnn(90900),
               kCudnn9_10_0 = cudnn(91000), kCudnn9_19 = cudnn(91900);

AttentionSpec spec_of(std::int64_t d_qk, std::int64_t d_v, std::int64_t s_q = 256, std::int64_t s_kv = 256) {
  ProblemShape shape;
  shape.batch = 2;
  shape.seq_q = s_q;
  shape.seq_kv = s_kv;
  shape.heads_q = 8;
  shape.heads_kv = 8;
  shape.head_dim_qk = d_qk;
  shape.head_dim_v = d_v;
  return spec_for_layout(Layout::bshd, shape);
}

AttentionSpec bottom_right(AttentionSpec spec) {
  spec.window = kCausal;
  spec.alignment = Alignment::bottom_right;
  return spec;
}

std::vector<std::string> fields_of(const Support& support) {
  std::vector<std::string> out;
  for (const Reason& reason : support.reasons) out.push_back(reason.field);
  return out;
}

const Reason* find_reason(const Support& support, const std::string& field, const std::string& lifted_by) {
  for (const Reason& reason : support.reasons) {
    if (reason.field == field && reason.lifted_by == lifted_by) return &reason;
  }
  return nullptr;
}

// Exactly one reason, with this field, value and lifted_by.
void expect_only(const Support& support, const std::string& field, const std::string& value, const std::string& lifted_by) {
  ASSERT_EQ(support.reasons.size(), 1u) << support.to_string();
  EXPECT_EQ(support.reasons[0].field, field);
  EXPECT_EQ(support.reasons[0].value, value);
  EXPECT_EQ(support.reasons[0].lifted_by, lifted_by) << support.to_string();
  EXPECT_FALSE(support.reasons[0].requirement.empty());
  EXPECT_FALSE(support.ok());
}

TEST(SupportPolicy, CommonCasesAreSupported) {
  for (DeviceCaps caps : {kSm80, kSm86, kSm90, kSm100, kSm120}) {
    for (Pass pass : {Pass::forward, Pass::backward}) {
      Support support = check_support_policy(spec_of(128, 128), pass, caps, kCudnn9_19);
      EXPECT_TRUE(support.ok()) << caps.sm() << " " << to_string(pass) << ": " << support.to_string();
      EXPECT_EQ(support.to_string(), "supported");
    }
  }
  EXPECT_TRUE(check_support_policy(spec_of(64, 64), Pass::backward, kSm80, kCudnn9_5).ok());
}

TEST(SupportDevice, TuringIsTooOld) {
  Support support = check_support_policy(spec_of(64, 64), Pass::forward, kSm75, kCudnn9_19);
  expect_only(support, "device", "SM 7.5", "an Ampere (SM 8.0) or newer GPU");
}

TEST(SupportCudnn, RuntimeMustBeCudnn9MatchingTheHeaders) {
  Support old = check_support_policy(spec_of(64, 64), Pass::forward, kSm90, kCudnn8_9);
  expect_only(old, "cudnn", "8.9.7 at run time, headers 9.19.0", "a cuDNN 9 runtime (9.0 or newer) matching the headers");
  EXPECT_EQ(old.reasons[0].requirement, "cuDNN 9.x at run time matching the 9.x headers");

  Versions newer_major = cudnn(100100);
  Support mismatch = check_support_policy(spec_of(64, 64), Pass::forward, kSm90, newer_major);
  ASSERT_EQ(mismatch.reasons.size(), 1u) << mismatch.to_string();
  EXPECT_EQ(mismatch.reasons[0].field, "cudnn");
  EXPECT_EQ(mismatch.reasons[0].value, "10.1.0 at run time, headers 9.19.0");

  Versions older_minor = cudnn(90500);  // same major, older minor: fine for this rule
  EXPECT_TRUE(check_support_policy(spec_of(64, 64), Pass::forward, kSm90, older_minor).ok());
}

TEST(SupportCudnn, BackwardOf9_10_0And9_10_1IsKnownBroken) {
  for (int runtime : {91000, 91001}) {
    Support backward = check_support_policy(spec_of(64, 64), Pass::backward, kSm90, cudnn(runtime));
    expect_only(backward, "cudnn", runtime == 91000 ? "9.10.0" : "9.10.1", "cuDNN 9.10.2");
    EXPECT_TRUE(check_support_policy(spec_of(64, 64), Pass::forward, kSm90, cudnn(runtime)).ok());
  }
  EXPECT_TRUE(check_support_policy(spec_of(64, 64), Pass::backward, kSm90, cudnn(91002)).ok());
}

TEST(SupportHeadDim, ForwardAbove256IsOutEverywhere) {
  for (DeviceCaps caps : {kSm80, kSm90, kSm100, kSm120}) {
    Support support = check_support_policy(spec_of(512, 512), Pass::forward, caps, kCudnn9_19);
    EXPECT_EQ(fields_of(support), (std::vector<std::string>{"d_qk", "d_v"})) << support.to_string();
    for (const Reason& reason : support.reasons) {
      EXPECT_EQ(reason.value, "512");
      EXPECT_EQ(reason.lifted_by, "");
      EXPECT_NE(reason.requirement.find("SM 10.x"), std::string::npos) << reason.requirement;
    }
  }
  EXPECT_TRUE(check_support_policy(spec_of(256, 256), Pass::forward, kSm90, kCudnn9_19).ok());
}

TEST(SupportHeadDim, ForwardAbove128OnAmpereNeedsCudnn9_10) {
  Support old = check_support_policy(spec_of(192, 128), Pass::forward, kSm86, kCudnn9_5);
  expect_only(old, "d_qk", "192", "cuDNN 9.10");
  expect_only(check_support_policy(spec_of(192, 128), Pass::forward, kSm86, kCudnn9_9), "d_qk", "192", "cuDNN 9.10");
  EXPECT_TRUE(check_support_policy(spec_of(192, 128), Pass::forward, kSm86, kCudnn9_10_0).ok());  // the boundary
  EXPECT_TRUE(check_support_policy(spec_of(192, 128), Pass::forward, kSm86, kCudnn9_19).ok());
  EXPECT_TRUE(check_support_policy(spec_of(192, 128), Pass::forward, kSm90, kCudnn9_5).ok());  // only SM 8.x
}

TEST(SupportHeadDim, BackwardAbove128NeedsHopperOnOtherGpus) {
  for (DeviceCaps caps : {kSm80, kSm86, kSm120}) {
    Support support = check_support_policy(spec_of(256, 160), Pass::backward, caps, kCudnn9_19);
    EXPECT_EQ(fields_of(support), (std::vector<std::string>{"d_qk", "d_v"})) << support.to_string();
    for (const Reason& reason : support.reasons) EXPECT_EQ(reason.lifted_by, "a Hopper (SM 9.0) GPU");
  }
  EXPECT_TRUE(check_support_policy(spec_of(256, 160), Pass::backward, kSm90, kCudnn9_19).ok());
  Support too_wide = check_support_policy(spec_of(320, 64), Pass::backward, kSm90, kCudnn9_19);
  expect_only(too_wide, "d_qk", "320", "");
  Support nowhere = check_support_policy(spec_of(320, 64), Pass::backward, kSm80, kCudnn9_19);
  expect_only(nowhere, "d_qk", "320", "");  // Hopper would not lift 320 either
}

TEST(SupportHeadDim, BackwardOnBlackwell) {
  // cuDNN 9.11+ on SM 10.x: 192/128 (MLA) is in, other pairs above 128 are out.
  EXPECT_TRUE(check_support_policy(spec_of(192, 128), Pass::backward, kSm100, kCudnn9_19).ok());
  expect_only(check_support_policy(spec_of(192, 192), Pass::backward, kSm100, kCudnn9_19), "d_v", "192",
              "a Hopper (SM 9.0) GPU");
  Support wide = check_support_policy(spec_of(160, 160), Pass::backward, kSm100, kCudnn9_19);
  EXPECT_EQ(fields_of(wide), (std::vector<std::string>{"d_qk", "d_v"})) << wide.to_string();
  // 256/256 arrives in 9.23.
  expect_only(check_support_policy(spec_of(256, 256), Pass::backward, kSm100, kCudnn9_19), "d_qk", "256",
              "cuDNN 9.23 (or a Hopper GPU)");
  EXPECT_TRUE(check_support_policy(spec_of(256, 256), Pass::backward, kSm100, cudnn(92300)).ok());
  // Before 9.11 SM 10.x stops at 128, and 9.11 is what lifts 192/128 there.
  Support before = check_support_policy(spec_of(192, 128), Pass::backward, kSm100, kCudnn9_5);
  expect_only(before, "d_qk", "192", "cuDNN 9.11 (or a Hopper GPU)");
  expect_only(check_support_policy(spec_of(192, 128), Pass::backward, kSm100, cudnn(91002)), "d_qk", "192",
              "cuDNN 9.11 (or a Hopper GPU)");
  EXPECT_TRUE(check_support_policy(spec_of(192, 128), Pass::backward, kSm100, cudnn(91100)).ok());  // the boundary
  expect_only(check_support_policy(spec_of(256, 256), Pass::backward, kSm100, cudnn(92200)), "d_qk", "256",
              "cuDNN 9.23 (or a Hopper GPU)");
}

TEST(SupportAlignment, BottomRightNeedsCudnn9_6) {
  AttentionSpec spec = bottom_right(spec_of(128, 128, 64, 256));
  expect_only(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_5), "align", "bottom_right", "cuDNN 9.6");
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, cudnn(90600)).ok());  // the boundary
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_9).ok());
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19).ok());
}

TEST(SupportAlignment, BottomRightBackwardOnHopperNeedsCudnn9_10) {
  AttentionSpec spec = bottom_right(spec_of(128, 128, 64, 256));
  expect_only(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_9), "align", "bottom_right", "cuDNN 9.10");
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, cudnn(91002)).ok());
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm80, kCudnn9_9).ok());  // Hopper only
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_9).ok());
}

TEST(SupportAlignment, BottomRightWithMoreQueriesThanKeysIsRejectedForGood) {
  AttentionSpec spec = bottom_right(spec_of(128, 128, 300, 200));
  for (Pass pass : {Pass::forward, Pass::backward}) {
    Support support = check_support_policy(spec, pass, kSm90, kCudnn9_19);
    expect_only(support, "align", "bottom_right", "");
    EXPECT_NE(support.reasons[0].requirement.find("first 100 query rows see no key"), std::string::npos)
        << support.reasons[0].requirement;
  }
}

TEST(SupportAlignment, IgnoredWithoutCausal) {
  AttentionSpec spec = spec_of(128, 128, 300, 200);
  spec.alignment = Alignment::bottom_right;  // not causal: the alignment is unused
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_5).ok());
}

TEST(SupportPolicy, EveryApplicableReasonIsReturnedTogether) {
  AttentionSpec spec = bottom_right(spec_of(512, 512, 300, 200));
  Support support = check_support_policy(spec, Pass::backward, kSm75, kCudnn8_9);
  EXPECT_EQ(fields_of(support), (std::vector<std::string>{"device", "cudnn", "d_qk", "d_v", "align", "align"}))
      << support.to_string();
  EXPECT_NE(find_reason(support, "device", "an Ampere (SM 8.0) or newer GPU"), nullptr);
  EXPECT_NE(find_reason(support, "align", "cuDNN 9.6"), nullptr);
  EXPECT_NE(find_reason(support, "align", ""), nullptr);  // s_q > s_kv: nothing lifts it

  // Hopper, 9.9, backward, bottom-right and too wide: three independent reasons.
  Support hopper = check_support_policy(bottom_right(spec_of(320, 64, 300, 200)), Pass::backward, kSm90, kCudnn9_9);
  EXPECT_EQ(fields_of(hopper), (std::vector<std::string>{"d_qk", "align", "align"})) << hopper.to_string();
  EXPECT_NE(find_reason(hopper, "align", "cuDNN 9.10"), nullptr);

  // 9.10.0 backward on Ampere with a wide head: the broken release and the head dim, together.
  Support ampere = check_support_policy(spec_of(192, 192), Pass::backward, kSm80, kCudnn9_10_0);
  EXPECT_EQ(fields_of(ampere), (std::vector<std::string>{"cudnn", "d_qk", "d_v"})) << ampere.to_string();
  EXPECT_NE(find_reason(ampere, "cudnn", "cuDNN 9.10.2"), nullptr);
}

TEST(SupportText, ReasonsPrintOnePerLine) {
  Reason reason{"d_qk", "192", "at most 128", "cuDNN 9.10"};
  EXPECT_EQ(reason.to_string(), "d_qk = 192: needs at most 128 (lifted by cuDNN 9.10)");
  Reason forever{"align", "bottom_right", "s_q <= s_kv", ""};
  EXPECT_EQ(forever.to_string(), "align = bottom_right: needs s_q <= s_kv");

  Support support = check_support_policy(spec_of(512, 512), Pass::forward, kSm75, kCudnn9_19);
  ASSERT_EQ(support.reasons.size(), 3u);
  const std::string text = support.to_string();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  for (const Reason& r : support.reasons) EXPECT_NE(text.find(r.to_string()), std::string::npos);
}

TEST(SupportText, PassNames) {
  EXPECT_STREQ(to_string(Pass::forward), "forward");
  EXPECT_STREQ(to_string(Pass::backward), "backward");
}

TEST(SupportSequence, SingleQuerySingleKeyBackwardIsRefused) {
  Support backward = check_support_policy(spec_of(64, 64, 1, 1), Pass::backward, kSm90, kCudnn9_19);
  expect_only(backward, "s_q", "1 (and s_kv = 1)", "");
  EXPECT_TRUE(check_support_policy(spec_of(64, 64, 1, 1), Pass::forward, kSm90, kCudnn9_19).ok());
  EXPECT_TRUE(check_support_policy(spec_of(64, 64, 1, 17), Pass::backward, kSm90, kCudnn9_19).ok());
  EXPECT_TRUE(check_support_policy(spec_of(64, 64, 17, 1), Pass::backward, kSm90, kCudnn9_19).ok());
}

TEST(SupportWindow, SlidingWindowsNeedNoMoreQueriesThanKeys) {
  AttentionSpec spec = spec_of(128, 128, 300, 200);
  spec.window = Window{64, 0};
  Support support = check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19);
  expect_only(support, "window", "64,0", "");
  spec = spec_of(128, 128, 200, 300);
  spec.window = Window{64, 0};
  for (Alignment alignment : {Alignment::top_left, Alignment::bottom_right}) {
    spec.alignment = alignment;
    EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19).ok());
    EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19).ok());
  }
}

TEST(SupportWindow, OlderCudnnNeedsARightBoundWithTheLeft) {
  AttentionSpec spec = spec_of(128, 128, 256, 256);
  spec.window = Window{64, -1};
  expect_only(check_support_policy(spec, Pass::forward, kSm90, cudnn(91001)), "window", "64,-1", "cuDNN 9.10.2");
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, cudnn(91002)).ok());
}

// With runtime lengths (which may differ per entry) a bottom-right window stays bottom-right, and
// before 9.10 Hopper's kernels got it wrong at equal lengths; with lengths fixed by the spec it is
// the top-left window it equals, which every version takes.
TEST(SupportWindow, BottomRightAtEqualLengthsOnHopperNeedsCudnn9_10) {
  AttentionSpec spec = spec_of(128, 128, 256, 256);
  spec.window = Window{64, 0};
  spec.alignment = Alignment::bottom_right;
  spec.padding = true;
  Support old = check_support_policy(spec, Pass::forward, kSm90, kCudnn9_9);
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.to_string().find("cuDNN 9.10"), std::string::npos) << old.to_string();
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19).ok());
  spec.padding = false;
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_9).ok());
}

TEST(SupportWindow, RightBoundWidensWhatBottomRightRowsSee) {
  // Bottom-right with 4 more queries than keys: a right bound of 4 gives every row a key.
  AttentionSpec spec = spec_of(128, 128, 104, 100);
  spec.alignment = Alignment::bottom_right;
  spec.window = Window{-1, 3};
  EXPECT_FALSE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19).ok());
  spec.window = Window{-1, 4};
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19).ok());
}

TEST(SupportPadding, RuntimeLengthsLiftTheShapeRulesCudnnAppliesToUnpaddedShapes) {
  AttentionSpec spec = bottom_right(spec_of(128, 128, 300, 200));
  spec.window = Window{64, 0};
  EXPECT_FALSE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19).ok());
  spec.padding = true;  // the entries' actual lengths decide, at run time
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19).ok());
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19).ok());
}

TEST(SupportDeterministic, BlackwellNeedsCudnn9_18) {
  AttentionSpec spec = spec_of(128, 128);
  spec.deterministic = true;
  const DeviceCaps blackwell{10, 0};
  expect_only(check_support_policy(spec, Pass::backward, blackwell, cudnn(91700)), "deterministic", "1", "cuDNN 9.18");
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, blackwell, kCudnn9_19).ok());
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, blackwell, cudnn(91700)).ok());
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19).ok());
}

TEST(SupportScoreTerms, BiasAndAlibiNeedATopLeftDiagonal) {
  AttentionSpec spec = bottom_right(spec_of(128, 128, 200, 300));
  spec.bias = Bias::one_hss;
  spec.alibi = true;
  Support support = check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19);
  EXPECT_EQ(fields_of(support), (std::vector<std::string>{"bias", "alibi"})) << support.to_string();
  spec.alignment = Alignment::top_left;
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19).ok());
  spec.window = Window{};  // ALiBi's j - i term is defined under a causal diagonal only
  expect_only(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19), "alibi", "1", "");
}

TEST(SupportScoreTerms, OldCudnnLimitsWindowsAndBiasGradients) {
  AttentionSpec spec = spec_of(128, 128, 200, 300);
  spec.bias = Bias::bhss;
  spec.window = Window{64, 0};
  expect_only(check_support_policy(spec, Pass::forward, kSm90, cudnn(91001)), "bias", "bhss", "cuDNN 9.10.2");
  spec.window = kCausal;
  spec.bias_grad = true;
  expect_only(check_support_policy(spec, Pass::backward, kSm90, cudnn(90400)),
              "bias_grad", "1", "cuDNN 9.5");
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19).ok());
}

TEST(SupportScoreTerms, BackwardNeedsABiasWithQueryRows) {
  AttentionSpec spec = spec_of(128, 128, 200, 300);
  spec.bias = Bias::one_11s;
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19).ok());
  expect_only(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19), "bias", "111s", "");
  spec.bias_grad = true;
  expect_only(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19), "bias", "111s", "");
  for (Bias bias : {Bias::bhss, Bias::b1ss, Bias::one_hss, Bias::one_1ss}) {
    spec.bias = bias;
    EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19).ok()) << to_string(bias);
  }
}

TEST(SupportSoftmax, MaxLogitIsOfferedOnlyWithoutASink) {
  AttentionSpec spec = spec_of(128, 128);
  spec.max_logit = MaxLogit::row;
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19).ok());
  spec.softmax = Softmax::sink;
  expect_only(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19), "max_logit", "row", "");
}

TEST(SupportSoftmax, SinksNeedCudnn9_13) {
  for (Softmax softmax : {Softmax::off_by_one, Softmax::sink}) {
    AttentionSpec spec = spec_of(128, 128);
    spec.softmax = softmax;
    expect_only(check_support_policy(spec, Pass::forward, kSm90, cudnn(91200)), "softmax", to_string(softmax),
                "cuDNN 9.13");
    EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19).ok());
  }
}

TEST(SupportDropout, NoBottomRightDiagonalAndOlderWindowLimits) {
  AttentionSpec spec = bottom_right(spec_of(128, 128, 200, 300));
  spec.dropout = 0.1;
  expect_only(check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19), "dropout", "0.1", "");
  spec.alignment = Alignment::top_left;
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19).ok());
  spec.window = Window{64, 0};
  expect_only(check_support_policy(spec, Pass::forward, kSm90, cudnn(91001)), "dropout", "0.1", "cuDNN 9.10.2");
}

}  // namespace
}  // namespace fusedattn
