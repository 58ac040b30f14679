// Tier 1: FP8 specs — what validation accepts, and the support policy's FP8 reasons on made-up
// GPUs and cuDNN versions, each with what lifts it.
#include <gtest/gtest.h>

#include <initializer_list>
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
            "cudnn(cuDNN 9.10.1);");
}

// cuDNN 9.26's forward amax of O with runtime lengths was wrong on an H100: the FP8 forward with
// padding is refused there for the loaded library's fault (field "cudnn"), not beside 9.19 or 9.28;
// its backward's amaxes were right.
TEST(Fp8Policy, RuntimeLengthsAreRefusedOnCudnn9_26) {
  AttentionSpec padded = fp8_spec();
  padded.padding = true;
  EXPECT_EQ(fields(check_support_policy(padded, Pass::forward, kSm90, made_up_versions(92600))), "cudnn(cuDNN 9.28);");
  EXPECT_TRUE(check_support_policy(padded, Pass::backward, kSm90, made_up_versions(92600)).ok());
  for (Pass pass : {Pass::forward, Pass::backward}) {
    EXPECT_TRUE(check_support_policy(padded, pass, kSm90, kCudnn9_19).ok());
    EXPECT_TRUE(check_support_policy(padded, pass, kSm90, made_up_versions(92801)).ok());
    EXPECT_TRUE(check_support_policy(fp8_spec(), pass, kSm90, made_up_versions(92600)).ok());
  }
}

TEST(Fp8Policy, HopperBackwardNeedsHeadDim128AndBlackwellLiftsIt) {
  const Support hopper = check_support_policy(fp8_spec(64), Pass::backward, kSm90, kCudnn9_19);
  EXPECT_EQ(fields(hopper), "d_qk(a Blackwell (SM 10.0) GPU);d_v(a Blackwell (SM 10.0) GPU);");
  EXPECT_TRUE(check_support_policy(fp8_spec(64), Pass::backward, kSm100, kCudnn9_19).ok());
  // Not a multiple of 16: nothing lifts it.
  const Support odd = check_support_policy(fp8_spec(72), Pass::forward, kSm90, kCudnn9_19);
  EXPECT_EQ(fields(odd), "d_qk();d_v();");
}

// Causal bottom-right with more keys than queries: a diagonal Hopper's FP8 kernels do not take.
AttentionSpec fp8_bottom_right(std::int64_t s_q, std::int64_t s_kv) {
  ProblemShape shape;
  shape.dtype = DType::e4m3;
  shape.batch = 2;
  shape.seq_q = s_q;
  shape.seq_kv = s_kv;
  shape.heads_q = shape.heads_kv = 8;
  shape.head_dim_qk = shape.head_dim_v = 128;
  AttentionSpec spec = spec_for_layout(Layout::bshd, shape);
  spec.window = kCausal;
  spec.alignment = Alignment::bottom_right;
  return spec;
}

TEST(Fp8Policy, HopperLimitsNameTheGpuThatLiftsThem) {
  EXPECT_EQ(fields(check_support_policy(fp8_bottom_right(512, 1024), Pass::forward, kSm90, kCudnn9_19)),
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

// --- MXFP8 block scaling (fp8_scaling=mxfp8) -------------------------------------------------------

// O 16-bit: cuDNN's MXFP8 graphs write it unscaled (validate() refuses an FP8 O).
AttentionSpec mxfp8_spec() {
  AttentionSpec spec = fp8_spec();
  spec.fp8_scaling = Fp8Scaling::mxfp8;
  spec.o.dtype = DType::bf16;
  return spec;
}

TEST(Mxfp8Spec, PrintsAndParsesBackAndIsOnlyPrintedWhenNotDefault) {
  const AttentionSpec spec = mxfp8_spec();
  const std::string text = to_string(spec);
  EXPECT_NE(text.find("fp8_scaling=mxfp8"), std::string::npos) << text;
  EXPECT_EQ(parse_spec(text), spec) << text;
  EXPECT_EQ(parse_spec(text).fp8_scaling, Fp8Scaling::mxfp8);
  EXPECT_EQ(to_string(parse_spec(text)), text);
  EXPECT_NE(spec, fp8_spec());
  EXPECT_NE(hash_value(spec), hash_value(fp8_spec()));
  EXPECT_EQ(to_string(fp8_spec()).find("fp8_scaling"), std::string::npos) << to_string(fp8_spec());
  EXPECT_EQ(parse_spec(to_string(fp8_spec()) + " fp8_scaling=tensor"), fp8_spec());
  EXPECT_NE(text.find("o=bf16["), std::string::npos) << text;  // a 16-bit O beside FP8 inputs: the full form
  EXPECT_STREQ(to_string(Fp8Scaling::tensor), "tensor");
  EXPECT_STREQ(to_string(Fp8Scaling::mxfp8), "mxfp8");
  try {
    parse_spec(to_string(fp8_spec()) + " fp8_scaling=nvfp4");
    FAIL() << "fp8_scaling=nvfp4 parsed";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("fp8_scaling"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("one of tensor, mxfp8"), std::string::npos) << error.what();
  }
}

TEST(Mxfp8Spec, ValidateNeedsFp8Inputs) {
  EXPECT_NO_THROW(validate(mxfp8_spec()));
  AttentionSpec e5m2 = mxfp8_spec();
  e5m2.q.dtype = e5m2.k.dtype = e5m2.v.dtype = DType::e5m2;
  e5m2.o.dtype = DType::f16;
  EXPECT_NO_THROW(validate(e5m2));
  AttentionSpec odd = fp8_spec(48);  // no multiple of 32 asked: a row's last block may be short
  odd.fp8_scaling = Fp8Scaling::mxfp8;
  odd.o.dtype = DType::bf16;
  EXPECT_NO_THROW(validate(odd));
  AttentionSpec half = mxfp8_spec();
  half.q.dtype = half.k.dtype = half.v.dtype = half.o.dtype = DType::bf16;
  try {
    validate(half);
    FAIL() << "fp8_scaling=mxfp8 with bf16 accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), "fp8_scaling");
    EXPECT_EQ(error.value(), "mxfp8");
    EXPECT_NE(std::string(error.what()).find("FP8 q, k and v"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("q is bf16"), std::string::npos) << error.what();
  }
}

// validate(spec) refuses it naming `field` and `value`, with each of `words` in the requirement.
void expect_invalid(const AttentionSpec& spec, const std::string& field, const std::string& value,
                    std::initializer_list<const char*> words) {
  try {
    validate(spec);
    ADD_FAILURE() << "validated: " << to_string(spec);
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), field) << error.what();
    EXPECT_EQ(error.value(), value) << error.what();
    for (const char* w : words) EXPECT_NE(error.requirement().find(w), std::string::npos) << error.what();
  }
}

TEST(Mxfp8Spec, AnFp8OIsAnInvalidArgument) {
  // No GPU lifts it: the MXFP8 graphs have no O scale, so this is the spec's contradiction.
  for (DType o : {DType::e4m3, DType::e5m2}) {
    AttentionSpec spec = mxfp8_spec();
    spec.o.dtype = o;
    expect_invalid(spec, "o.dtype", to_string(o), {"f16 or bf16 with fp8_scaling=mxfp8", "o=bf16["});
  }
}

TEST(Mxfp8Spec, TheGradientsAreOs16BitDtype) {
  for (DType o : {DType::bf16, DType::f16}) {
    AttentionSpec spec = mxfp8_spec();
    spec.o.dtype = o;
    EXPECT_EQ(gradient_dtype(spec), o);
    const TensorDesc d_q = gradient_desc(spec.q, spec);
    EXPECT_EQ(d_q.dtype, o);
    EXPECT_EQ(d_q.strides, spec.q.strides);
  }
  AttentionSpec hybrid = mxfp8_spec();
  hybrid.fp8_gradients = Fp8Gradients::e5m2;  // E5M2 gradients contradict 16-bit ones
  expect_invalid(hybrid, "fp8_grads", "e5m2", {"as_inputs with fp8_scaling=mxfp8"});
}

TEST(Mxfp8Policy, HopperWithCudnn9_19RefusesTheForwardTwiceNamingWhatLiftsEach) {
  const Support support = check_support_policy(mxfp8_spec(), Pass::forward, kSm90, kCudnn9_19);
  ASSERT_EQ(support.reasons.size(), 2u) << support.to_string();
  EXPECT_EQ(fields(support), "fp8_scaling(cuDNN 9.21);fp8_scaling(a Blackwell (SM 10.0) GPU);");
  for (const Reason& reason : support.reasons) EXPECT_EQ(reason.value, "mxfp8");
  EXPECT_EQ(support.reasons[0].requirement, "cuDNN 9.21 or newer for MXFP8 block scaling (loaded: 9.19.0)");
  EXPECT_EQ(support.reasons[1].requirement,
            "an SM 10.x (Blackwell data-center) GPU for the MXFP8 forward, not SM 9.0");
}

TEST(Mxfp8Policy, HopperRefusesTheBackwardForItsCudnnAndIts16BitGradients) {
  // The MXFP8 check of the backward names no GPU, its 16-bit dQ, dK, dV do (SM 10.0 and newer);
  // the per-tensor rule's "an FP8 O on SM 9.x" is no way out for MXFP8, so it is not said.
  const Support support = check_support_policy(mxfp8_spec(), Pass::backward, kSm90, kCudnn9_19);
  EXPECT_EQ(fields(support), "fp8_scaling(cuDNN 9.21);fp8_scaling(a Blackwell (SM 10.0) GPU);") << support.to_string();
  EXPECT_EQ(support.reasons[1].requirement,
            "an SM 10.0 or newer GPU for the MXFP8 backward (its 16-bit dQ, dK, dV), not SM 9.0");
  EXPECT_EQ(fields(check_support_policy(mxfp8_spec(), Pass::backward, kSm90, made_up_versions(92100))),
            "fp8_scaling(a Blackwell (SM 10.0) GPU);");
}

TEST(Mxfp8Policy, BlackwellWithCudnn9_21AcceptsBothPassesAtHeadDim128) {
  // The policy's yes; cuDNN's own check is the last word (the graph: tests/graph/test_mxfp8_graph.cpp).
  const Versions cudnn9_21 = made_up_versions(92100);
  for (DType o : {DType::bf16, DType::f16}) {
    AttentionSpec spec = mxfp8_spec();
    spec.o.dtype = o;
    ASSERT_NO_THROW(validate(spec));
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const Support support = check_support_policy(spec, pass, kSm100, cudnn9_21);
      EXPECT_TRUE(support.ok()) << to_string(pass) << ": " << support.to_string();
    }
  }
  ProblemShape shape = problem_shape(mxfp8_spec());  // grouped heads and s_q != s_kv, as the graph test has
  shape.seq_q = 200;
  shape.seq_kv = 333;
  shape.heads_kv = 2;
  AttentionSpec gqa = spec_for_layout(Layout::bshd, shape);
  gqa.fp8_scaling = Fp8Scaling::mxfp8;
  gqa.o.dtype = DType::bf16;
  ASSERT_NO_THROW(validate(gqa));
  EXPECT_TRUE(check_support_policy(gqa, Pass::forward, kSm100, cudnn9_21).ok());
  EXPECT_TRUE(check_support_policy(gqa, Pass::backward, kSm100, cudnn9_21).ok());
  // Either limit alone is one reason.
  EXPECT_EQ(fields(check_support_policy(mxfp8_spec(), Pass::forward, kSm100, kCudnn9_19)), "fp8_scaling(cuDNN 9.21);");
  EXPECT_EQ(fields(check_support_policy(mxfp8_spec(), Pass::forward, DeviceCaps{12, 0}, cudnn9_21)),
            "fp8_scaling(a Blackwell (SM 10.0) GPU);");
}

TEST(Mxfp8Policy, PerTensorFp8RulesStillApply) {
  AttentionSpec spec = mxfp8_spec();
  spec.dropout = 0.1;
  const Support support = check_support_policy(spec, Pass::forward, kSm100, made_up_versions(92100));
  EXPECT_EQ(fields(support), "dropout();") << support.to_string();
}

// --- E5M2 gradients beside E4M3 inputs (fp8_grads=e5m2, the hybrid recipe) -------------------------

TEST(Fp8Gradients, PrintParseAndTheGradientsDescriptors) {
  AttentionSpec hybrid = fp8_spec();
  hybrid.fp8_gradients = Fp8Gradients::e5m2;
  const std::string text = to_string(hybrid);
  EXPECT_NE(text.find("fp8_grads=e5m2"), std::string::npos) << text;
  EXPECT_EQ(parse_spec(text), hybrid);
  EXPECT_EQ(to_string(fp8_spec()).find("fp8_grads"), std::string::npos);  // the default is not printed
  EXPECT_NO_THROW(validate(hybrid));
  EXPECT_EQ(gradient_dtype(hybrid), DType::e5m2);
  EXPECT_EQ(gradient_dtype(fp8_spec()), DType::e4m3);
  const TensorDesc d_o = gradient_desc(hybrid.o, hybrid);
  EXPECT_EQ(d_o.dtype, DType::e5m2);
  EXPECT_EQ(d_o.dims, hybrid.o.dims);
  EXPECT_EQ(d_o.strides, hybrid.o.strides);
  EXPECT_STREQ(to_string(Fp8Gradients::as_inputs), "as_inputs");
}

TEST(Fp8Gradients, OnlyE4M3InputsTakeE5M2Gradients) {
  for (DType dtype : {DType::e5m2, DType::bf16, DType::f16}) {
    AttentionSpec spec = fp8_spec(128, DType::e4m3);
    spec.q.dtype = spec.k.dtype = spec.v.dtype = spec.o.dtype = dtype;
    spec.fp8_gradients = Fp8Gradients::e5m2;
    try {
      validate(spec);
      FAIL() << "fp8_grads=e5m2 validated with " << to_string(dtype) << " inputs";
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(error.field(), "fp8_grads");
      EXPECT_NE(std::string(error.what()).find(std::string("q is ") + to_string(dtype)), std::string::npos)
          << error.what();
    }
  }
}

// At s_q == s_kv with lengths fixed by the spec, bottom-right places the diagonal where top-left
// does: it is judged (and built) as top-left, forward and backward. Runtime lengths may differ
// between Q and KV, so with them the refusal stands.
TEST(Fp8Policy, BottomRightAtEqualFixedLengthsIsTopLeft) {
  const AttentionSpec equal = fp8_bottom_right(512, 512);
  EXPECT_TRUE(check_support_policy(equal, Pass::forward, kSm90, kCudnn9_19).ok());
  EXPECT_TRUE(check_support_policy(equal, Pass::backward, kSm90, kCudnn9_19).ok());
  AttentionSpec runtime_lengths = equal;
  runtime_lengths.padding = true;
  EXPECT_EQ(fields(check_support_policy(runtime_lengths, Pass::forward, kSm90, kCudnn9_19)),
            "align(a Blackwell (SM 10.0) GPU);");
}

}  // namespace
}  // namespace fusedattn
