// GPU tier: FP8 attention (E4M3, E5M2) forward and backward against the float32 reference of the
// dequantized inputs, with fusedattn's BF16 result beside it (testing/fp8_check.h), and the FP8
// call's own input checks. Without a GPU, or on one older than Hopper, each test skips and says why.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/plan_cache.h"
#include "gpu_skip.h"
#include "testing/fp8_check.h"

namespace fusedattn {
namespace {

#define FUSEDATTN_REQUIRE_FP8_GPU()                                                              \
  do {                                                                                           \
    FUSEDATTN_REQUIRE_GPU();                                                                     \
    if (current_device_caps().sm() < 90) GTEST_SKIP() << "FP8 attention needs SM 9.0 or newer"; \
  } while (0)

struct Fp8Case {
  const char* name;
  const char* spec;
  bool backward;
};

class Fp8Numerics : public ::testing::TestWithParam<Fp8Case> {};

// Every case is one the support policy offers on Hopper with cuDNN 9.19, so a refusal by cuDNN
// fails the test: it would mean the policy promises what cuDNN does not do. Under another cuDNN,
// a case the policy refuses for that version's known fault alone skips with the reason.
TEST_P(Fp8Numerics, MatchesTheReferenceOfTheDequantizedInputs) {
  FUSEDATTN_REQUIRE_FP8_GPU();
  const AttentionSpec spec = parse_spec(GetParam().spec);
  for (Pass pass : {Pass::forward, Pass::backward}) {
    if (pass == Pass::backward && !GetParam().backward) continue;
    const Support answer = check_support(spec, pass);
    if (refused_for_the_loaded_cudnn(answer)) GTEST_SKIP() << to_string(pass) << ": " << answer.to_string();
    ASSERT_TRUE(answer.ok()) << to_string(pass) << ": " << answer.to_string();
  }
  const check::Fp8CheckResult result = check::check_fp8_against_reference(spec, GetParam().backward, 0);
  std::printf("%s\n", result.to_string().c_str());  // the errors per tensor, for the results file
  EXPECT_TRUE(result.passed) << result.to_string();
}

INSTANTIATE_TEST_SUITE_P(
    Gpu, Fp8Numerics,
    ::testing::Values(
        Fp8Case{"causal_128", "layout=bshd dtype=e4m3 b=2 s=512 h=8 d=128 causal", true},
        Fp8Case{"cross_64", "layout=bshd dtype=e4m3 b=2 s_q=256 s_kv=384 h=8 d=64", false},
        // Grouped heads: the first two backwards run ungrouped (src/support/kv_expansion.h), the
        // third has enough key tiles (9 * 8 * 16 = 1152 on an H200's 132 SMs) to stay grouped.
        Fp8Case{"gqa_16_4", "layout=bshd dtype=e4m3 b=1 s=1024 h_q=16 h_kv=4 d=128 causal", true},
        Fp8Case{"gqa_sbhd_e5m2", "layout=sbhd dtype=e5m2 b=2 s=512 h_q=8 h_kv=2 d=128", true},
        Fp8Case{"gqa_grouped", "layout=bshd dtype=e4m3 b=9 s=2048 h_q=16 h_kv=8 d=128 causal", true},
        Fp8Case{"sbhd_128", "layout=sbhd dtype=e4m3 b=2 s=256 h=4 d=128", true},
        Fp8Case{"packed_qkv_128", "layout=bs3hd dtype=e4m3 b=2 s=384 h=4 d=128 causal", true},
        Fp8Case{"window_128", "layout=bshd dtype=e4m3 b=2 s=512 h=4 d=128 window=128,0", true},
        Fp8Case{"d256_forward", "layout=bshd dtype=e4m3 b=1 s=256 h=4 d=256 causal", false},
        Fp8Case{"e5m2_128", "layout=bshd dtype=e5m2 b=2 s=256 h=4 d=128 causal", true},
        // Bottom-right at s_q == s_kv is the top-left diagonal, which Hopper's FP8 kernels take.
        Fp8Case{"bottom_right_square", "layout=bshd dtype=e4m3 b=2 s=384 h=4 d=128 causal align=bottom_right", true},
        // Runtime lengths (a padding mask, as TransformerEngine's FP8 attention takes it), forward
        // and backward: rows past each entry's lengths are zero in O and the gradients.
        Fp8Case{"padding_causal", "layout=bshd dtype=e4m3 b=3 s=384 h=4 d=128 causal padding=1", true},
        Fp8Case{"padding_cross_gqa", "layout=bshd dtype=e4m3 b=2 s_q=256 s_kv=320 h_q=8 h_kv=2 d=128 padding=1", true},
        Fp8Case{"padding_sbhd_forward", "layout=sbhd dtype=e4m3 b=2 s=200 h=4 d=64 padding=1", false},
        // The hybrid recipe: E4M3 inputs, dO and the gradients in E5M2; grouped (the K/V
        // expansion sums E5M2 partials) and not.
        Fp8Case{"hybrid_causal", "layout=bshd dtype=e4m3 b=2 s=512 h=8 d=128 causal fp8_grads=e5m2", true},
        Fp8Case{"hybrid_gqa", "layout=bshd dtype=e4m3 b=1 s=1024 h_q=16 h_kv=4 d=128 fp8_grads=e5m2", true}),
    [](const ::testing::TestParamInfo<Fp8Case>& info) { return std::string(info.param.name); });

TEST(Fp8Calls, AMissingScaleIsNamedAndNothingRuns) {
  FUSEDATTN_REQUIRE_FP8_GPU();
  const AttentionSpec spec = parse_spec("layout=bshd dtype=e4m3 b=1 s=128 h=2 d=128 causal");
  check::Fp8Problem problem(spec, false, 7);
  ForwardTensors t = problem.forward_tensors();
  t.fp8.descale_k = nullptr;
  try {
    forward(problem.spec(), t, default_scale(spec), nullptr, problem.workspace());
    FAIL() << "a forward without descale_k ran";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("tensors.fp8.descale_k"), std::string::npos) << error.what();
  }
}

TEST(Fp8Calls, ABottomRightDiagonalIsRefusedOnHopperNamingBlackwell) {
  FUSEDATTN_REQUIRE_FP8_GPU();
  if (current_device_caps().sm_major != 9) GTEST_SKIP() << "the limit is Hopper's";
  const Support answer = check_support(
      parse_spec("layout=bshd dtype=e4m3 b=1 s_q=128 s_kv=256 h=2 d=128 causal align=bottom_right"), Pass::forward);
  ASSERT_FALSE(answer.ok());
  EXPECT_NE(answer.to_string().find("Blackwell"), std::string::npos) << answer.to_string();
}

// MXFP8 needs cuDNN 9.21 and, forward, an SM 10.x GPU (its backward's 16-bit gradients SM 10.0 or
// newer): on the H200 with cuDNN 9.19 the policy refuses it, naming both, before any graph is built.
TEST(Fp8Calls, Mxfp8IsRefusedNamingCudnn9_21AndSm10AndNothingIsBuilt) {
  FUSEDATTN_REQUIRE_FP8_GPU();
  const DeviceCaps caps = current_device_caps();
  const int cudnn = current_versions().cudnn_runtime;
  if (caps.sm_major >= 10 && cudnn >= 92100) GTEST_SKIP() << "this GPU and cuDNN may take MXFP8";
  AttentionSpec spec = parse_spec("layout=bshd dtype=e4m3 b=1 s=128 h=2 d=128 causal fp8_scaling=mxfp8");
  spec.o.dtype = DType::bf16;  // MXFP8 writes O unscaled, in 16 bits
  const std::size_t plans = live_plans();
  for (Pass pass : {Pass::forward, Pass::backward}) {
    const bool needs_sm10 = pass == Pass::forward ? caps.sm_major != 10 : caps.sm_major < 10;
    const Support answer = check_support(spec, pass);
    ASSERT_FALSE(answer.ok()) << to_string(pass);
    for (const Reason& reason : answer.reasons) {
      EXPECT_EQ(reason.field, "fp8_scaling") << "not the policy's refusal: " << answer.to_string();
    }
    EXPECT_EQ(answer.to_string().find("cuDNN 9.21") != std::string::npos, cudnn < 92100) << answer.to_string();
    EXPECT_EQ(answer.to_string().find("SM 10.") != std::string::npos, needs_sm10) << answer.to_string();
    try {
      get_plan(spec, pass);
      FAIL() << to_string(pass) << ": a plan for MXFP8 on SM " << caps.sm();
    } catch (const NotSupported& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("fp8_scaling=mxfp8"), std::string::npos) << what;  // the spec, printed
      EXPECT_EQ(what.find("cuDNN 9.21") != std::string::npos, cudnn < 92100) << what;
      EXPECT_EQ(what.find("SM 10.") != std::string::npos, needs_sm10) << what;
    }
  }
  EXPECT_EQ(live_plans(), plans) << "a plan was made for a refused spec";
}

}  // namespace
}  // namespace fusedattn
