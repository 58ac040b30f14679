// Tier 1: FP8 specs — what validation accepts, and the support policy's FP8 reasons on made-up
// GPUs and cuDNN versions, each with what lifts it.
#include <gtest/gtest.h>

#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"
#include "made_up_versions.h"

namespace fusedattn {
namespace {

const DeviceCaps kSm80{8, 0}, kSm90{9, 0}, kSm100{10, 0};
const Versions kCudnn9_19 = made_up_versions(91900);

AttentionSpec fp8_spec(std::int64_t d = 128, DType dtype = DType::e4m3) {
  ProblemShape shape;
  shape.dtype = dtype;
  shape.batch = 2;
  shape.seq_q = shape.seq_kv = 512;
  shape.heads_q = shape.heads_kv = 8;
  shape.head_dim_qk = shape.head_dim_v = d;
  AttentionSpec spec = spec_for_layout(Layout::bshd, shape);
  spec.window = kCausal;
  return spec;
}

std::string fields(const Support& support) {
  std::string out;
  for (const Reason& r : support.reasons) out += r.field + "(" + r.lifted_by + ");";
  return out;
}

TEST(Fp8Spec, DtypesPrintAndParseBack) {
  for (DType dtype : {DType::e4m3, DType::e5m2}) {
    const AttentionSpec spec = fp8_spec(128, dtype);
    EXPECT_EQ(parse_spec(to_string(spec)), spec) << to_string(spec);
    EXPECT_NE(to_string(spec).find(std::string("dtype=") + to_string(dtype)), std::string::npos) << to_string(spec);
  }
  EXPECT_EQ(parse_dtype("fp8_e4m3", "dtype"), DType::e4m3);
  EXPECT_EQ(parse_dtype("FP8_E5M2", "dtype"), DType::e5m2);
  EXPECT_EQ(size_of(DType::e4m3), 1u);
  EXPECT_TRUE(is_fp8(DType::e5m2));
  EXPECT_FALSE(is_fp8(DType::bf16));
}

TEST(Fp8Spec, InputsShareOneDtypeAndOMayDiffer) {
  AttentionSpec spec = fp8_spec();
  EXPECT_NO_THROW(validate(spec));
  spec.o.dtype = DType::bf16;  // an FP8 call may write a 16-bit O (where cuDNN offers it)
  EXPECT_NO_THROW(validate(spec));
  spec.k.dtype = DType::e5m2;
  try {
    validate(spec);
    FAIL() << "mixed input dtypes accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("k.dtype"), std::string::npos) << error.what();
  }
  AttentionSpec half = fp8_spec();
  half.q.dtype = half.k.dtype = half.v.dtype = DType::bf16;  // a 16-bit call keeps o in q's dtype
  EXPECT_THROW(validate(half), InvalidArgument);
}

TEST(Fp8Policy, CausalE4m3AtHeadDim128IsSupportedBothWaysOnHopper) {
  for (Pass pass : {Pass::forward, Pass::backward}) {
    EXPECT_TRUE(check_support_policy(fp8_spec(), pass, kSm90, kCudnn9_19).ok()) << to_string(pass);
  }
  EXPECT_TRUE(check_support_policy(fp8_spec(64), Pass::forward, kSm90, kCudnn9_19).ok());
  EXPECT_TRUE(check_support_policy(fp8_spec(256), Pass::forward, kSm90, kCudnn9_19).ok());
}

TEST(Fp8Policy, AmpereAndOldCudnnAreOut) {
  const Support ampere = check_support_policy(fp8_spec(), Pass::forward, kSm80, kCudnn9_19);
  ASSERT_EQ(ampere.reasons.size(), 1u) << ampere.to_string();
  EXPECT_EQ(ampere.reasons[0].field, "dtype");
  EXPECT_EQ(ampere.reasons[0].lifted_by, "a Hopper (SM 9.0) GPU");
  EXPECT_EQ(fields(check_support_policy(fp8_spec(), Pass::forward, kSm90, made_up_versions(90000))), "dtype(cuDNN 9.1);");
  EXPECT_EQ(fields(check_support_policy(fp8_spec(), Pass::forward, kSm90, made_up_versions(91000))),
            "dtype(cuDNN 9.10.1);");
}

TEST(Fp8Policy, HopperBackwardNeedsHeadDim128AndBlackwellLiftsIt) {
  const Support hopper = check_support_policy(fp8_spec(64), Pass::backward, kSm90, kCudnn9_19);
  EXPECT_EQ(fields(hopper), "d_qk(a Blackwell (SM 10.0) GPU);d_v(a Blackwell (SM 10.0) GPU);");
  EXPECT_TRUE(check_support_policy(fp8_spec(64), Pass::backward, kSm100, kCudnn9_19).ok());
  // Not a multiple of 16: nothing lifts it.
  const Support odd = check_support_policy(fp8_spec(72), Pass::forward, kSm90, kCudnn9_19);
  EXPECT_EQ(fields(odd), "d_qk();d_v();");
}

TEST(Fp8Policy, HopperLimitsNameTheGpuThatLiftsThem) {
  AttentionSpec bottom_right = fp8_spec();
  bottom_right.alignment = Alignment::bottom_right;
  EXPECT_EQ(fields(check_support_policy(bottom_right, Pass::forward, kSm90, kCudnn9_19)),
            "align(a Blackwell (SM 10.0) GPU);");
  AttentionSpec half_out = fp8_spec();
  half_out.o.dtype = DType::bf16;
  EXPECT_EQ(fields(check_support_policy(half_out, Pass::forward, kSm90, kCudnn9_19)),
            "o.dtype(a Blackwell (SM 10.0) GPU with cuDNN 9.13);");
}

TEST(Fp8Policy, BiasIsRefusedAndUncheckedFeaturesAreNotOfferedYet) {
  AttentionSpec spec = fp8_spec();
  spec.bias = Bias::one_1ss;
  spec.softmax = Softmax::off_by_one;
  spec.dropout = 0.1;
  spec.max_logit = MaxLogit::row;
  const Support support = check_support_policy(spec, Pass::forward, kSm90, kCudnn9_19);
  for (const char* field : {"bias", "softmax", "dropout", "max_logit"}) {
    EXPECT_NE(fields(support).find(std::string(field) + "("), std::string::npos) << field << ": " << support.to_string();
  }
  EXPECT_NE(support.to_string().find("no bias with FP8"), std::string::npos) << support.to_string();
}

TEST(Fp8Policy, RaggedBackwardOnHopperIsOneReason) {
  ProblemShape shape = problem_shape(fp8_spec());
  AttentionSpec ragged = spec_for_layout(Layout::thd_thd_thd, shape);
  ragged.window = kCausal;
  const Support backward = check_support_policy(ragged, Pass::backward, kSm90, kCudnn9_19);
  EXPECT_EQ(fields(backward), "layout(a Blackwell (SM 10.0) GPU);") << backward.to_string();
  const Support forward = check_support_policy(ragged, Pass::forward, kSm90, kCudnn9_19);
  EXPECT_EQ(fields(forward), "layout();") << forward.to_string();
}

TEST(Fp8Policy, SixteenBitSpecsGetNoFp8Reasons) {
  AttentionSpec spec = fp8_spec(64);
  spec.q.dtype = spec.k.dtype = spec.v.dtype = spec.o.dtype = DType::bf16;
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, kSm90, kCudnn9_19).ok());
}

}  // namespace
}  // namespace fusedattn
