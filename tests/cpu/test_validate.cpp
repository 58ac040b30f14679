// Tier 1: validate() — one bad field at a time, each named with the value seen and the requirement.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <type_traits>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/spec.h"

namespace fusedattn {
namespace {

// GQA with s_q != s_kv: a valid spec on which each test breaks exactly one thing.
AttentionSpec good_spec(Layout layout = Layout::bshd) {
  ProblemShape shape;
  shape.batch = 2;
  shape.seq_q = 64;
  shape.seq_kv = 96;
  shape.heads_q = 8;
  shape.heads_kv = 2;
  shape.head_dim_qk = 64;
  shape.head_dim_v = 64;
  shape.page_size = 32;  // paged layouts: 3 pages a sequence, in a pool of 10
  shape.pages = 10;
  if (packs_qkv(layout)) {  // one buffer for all three needs equal sizes
    shape.seq_kv = shape.seq_q;
    shape.heads_kv = shape.heads_q;
  }
  return spec_for_layout(layout, shape);
}

// Asserts that validate() throws InvalidArgument for `field`, with `value` in its value.
void expect_invalid(const AttentionSpec& spec, const std::string& field, const std::string& value,
                    const std::string& requirement_part = "") {
  try {
    validate(spec);
    FAIL() << "accepted " << to_string(spec);
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(e.value().find(value), std::string::npos) << e.what();
    EXPECT_NE(e.requirement().find(requirement_part), std::string::npos) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
  }
}

TEST(ValidateGood, EveryLayoutPasses) {
  for (Layout layout : all_layouts()) EXPECT_NO_THROW(validate(good_spec(layout))) << to_string(layout);
}

TEST(ValidateGood, NonCausalBottomRightIsAllowed) {
  AttentionSpec spec = good_spec();
  spec.alignment = Alignment::bottom_right;
  EXPECT_NO_THROW(validate(spec));
}

TEST(ValidateGood, PaddedAndPermutedOutputsPass) {
  AttentionSpec spec = good_spec();
  spec.o.strides = {8 * 64 * 80, 80, 8 * 80, 1};  // rows padded to 80
  EXPECT_NO_THROW(validate(spec));
  spec.o.strides = contiguous_bhsd_strides(spec.o.dims);  // bhsd output for bshd inputs
  EXPECT_NO_THROW(validate(spec));
}

TEST(ValidateGood, SizeOneAxesMayHaveAnyPositiveStride) {
  AttentionSpec spec = good_spec();
  for (TensorDesc* t : {&spec.q, &spec.k, &spec.v, &spec.o}) t->dims[kBatch] = 1;
  spec.o.strides[kBatch] = 2;  // never stepped, so it cannot overlap anything
  EXPECT_NO_THROW(validate(spec));
}

TEST(ValidateDims, NonPositiveDim) {
  AttentionSpec spec = good_spec();
  spec.q.dims[kSeq] = 0;
  expect_invalid(spec, "q.dims", "[2,8,0,64]", "positive");
  spec = good_spec();
  spec.v.dims[kHead] = -2;
  expect_invalid(spec, "v.dims", "[2,-2,96,64]");
}

TEST(ValidateDtype, MixedDtypes) {
  AttentionSpec spec = good_spec();
  spec.k.dtype = DType::f16;
  expect_invalid(spec, "k.dtype", "f16", "bf16");
  spec = good_spec();
  spec.o.dtype = DType::f16;
  expect_invalid(spec, "o.dtype", "f16");
}

TEST(ValidateShape, BatchMismatch) {
  AttentionSpec spec = good_spec();
  spec.v.dims[kBatch] = 3;
  expect_invalid(spec, "b", "3", "v's batch");
}

TEST(ValidateShape, KAndVHeadsDiffer) {
  AttentionSpec spec = good_spec();
  spec.v.dims[kHead] = 4;
  expect_invalid(spec, "h_kv", "4", "k's (2)");
}

TEST(ValidateShape, HeadsQNotAMultipleOfHeadsKv) {
  AttentionSpec spec = good_spec();
  spec.q.dims[kHead] = 12;
  spec.o.dims[kHead] = 12;
  spec.k.dims[kHead] = 8;
  spec.v.dims[kHead] = 8;
  expect_invalid(spec, "h_q", "12", "a multiple of h_kv = 8 (GQA/MQA)");
}

TEST(ValidateShape, KAndVSequencesDiffer) {
  AttentionSpec spec = good_spec();
  spec.v.dims[kSeq] = 95;
  expect_invalid(spec, "s_kv", "95", "k's (96)");
}

TEST(ValidateShape, QAndKHeadDimsDiffer) {
  AttentionSpec spec = good_spec();
  spec.k.dims[kDim] = 128;
  expect_invalid(spec, "d_qk", "128", "q's (64)");
}

TEST(ValidateShape, OutputDims) {
  AttentionSpec spec = good_spec();
  spec.o.dims[kSeq] = 96;  // s_kv instead of s_q
  expect_invalid(spec, "o.dims", "[2,8,96,64]", "[2,8,64,64]");
}

TEST(ValidateShape, HeadDimsMultipleOf8) {
  AttentionSpec spec = good_spec();
  spec.q.dims[kDim] = spec.k.dims[kDim] = 60;
  expect_invalid(spec, "d_qk", "60", "multiple of 8");
  spec = good_spec();
  spec.v.dims[kDim] = spec.o.dims[kDim] = 36;
  expect_invalid(spec, "d_v", "36", "multiple of 8");
}

TEST(ValidateStrides, InnermostStrideMustBeOne) {
  AttentionSpec spec = good_spec();
  spec.q.strides[kDim] = 2;
  expect_invalid(spec, "q.strides", "[32768,64,512,2]", "innermost");
}

TEST(ValidateStrides, StridesMustBePositive) {
  AttentionSpec spec = good_spec();
  spec.k.strides[kSeq] = -spec.k.strides[kSeq];
  expect_invalid(spec, "k.strides", "-128", "positive");
  spec = good_spec();
  spec.v.strides[kHead] = 0;
  expect_invalid(spec, "v.strides", ",0,", "positive");
}

// A paged K/V is a pool of pages, whose count need not be the batch; its lengths are runtime.
TEST(ValidatePaged, PoolsTakeAnyPageCountAndNeedPadding) {
  AttentionSpec spec = good_spec(Layout::bshd_paged_bshd);
  EXPECT_EQ(spec.kv_pages, 3);
  EXPECT_EQ(spec.seq_kv(), 96);
  EXPECT_EQ(spec.page_size(), 32);
  EXPECT_TRUE(spec.padding);
  EXPECT_NO_THROW(validate(spec));
  spec.padding = false;
  expect_invalid(spec, "padding", "0", "padding=1 with paged caches");
  spec = good_spec(Layout::bshd_paged_bshd);
  spec.v.dims[kBatch] = 9;
  expect_invalid(spec, "v.dims", "[9,", "as many pages in v's pool as in k's");
  spec = good_spec(Layout::bshd_paged_bshd);
  spec.kv_pages = -1;
  expect_invalid(spec, "kv_pages", "-1", "0 (not paged) or a page count");
}

// A batch stride of 0 makes a tensor ragged; O follows Q and V follows K, and lengths are runtime.
TEST(ValidateStrides, RaggedTensorsComeInPairsWithPadding) {
  AttentionSpec spec = good_spec();
  spec.v.strides[kBatch] = 0;
  expect_invalid(spec, "v.strides", "[0,", "v ragged exactly when k is");
  spec = good_spec();
  spec.o.strides[kBatch] = 0;
  expect_invalid(spec, "o.strides", "[0,", "o ragged exactly when q is");
  spec = good_spec();
  spec.q.strides[kBatch] = spec.o.strides[kBatch] = 0;
  expect_invalid(spec, "padding", "0", "padding=1 with ragged tensors");
  spec.padding = true;
  EXPECT_NO_THROW(validate(spec));
  EXPECT_TRUE(spec.ragged_q());
  EXPECT_FALSE(spec.ragged_kv());
}

TEST(ValidateStrides, OutputMustNotOverlapItself) {
  AttentionSpec spec = good_spec();
  spec.o.strides[kSeq] = 32;  // rows of 64 elements every 32: neighbours share halves
  expect_invalid(spec, "o.strides", "[32768,64,32,1]", "overlap");
  spec = good_spec();
  spec.o.strides[kHead] = 1;  // heads one element apart: a head's row overlaps the next head's
  expect_invalid(spec, "o.strides", "[32768,1,512,1]", "overlap");
}

TEST(ValidateStrides, InputsMayOverlap) {
  // Overlapping reads are harmless: K rows that share elements (a sliding view) are still valid.
  AttentionSpec spec = good_spec();
  spec.k.strides[kSeq] = 8;
  EXPECT_NO_THROW(validate(spec));
}

TEST(ValidateWindow, BoundsMustBeNoneOrMeaningful) {
  AttentionSpec spec = good_spec();
  for (Window ok : {Window{}, kCausal, Window{1, 0}, Window{128, 7}, Window{-1, 3}, Window{5, -1}}) {
    spec.window = ok;
    EXPECT_NO_THROW(validate(spec)) << to_string(spec);
  }
  spec.window = Window{0, 0};  // a zero-key window hides the diagonal itself
  expect_invalid(spec, "window", "0,0", "at least 1 key");
  spec.window = Window{-2, 0};
  expect_invalid(spec, "window", "-2,0", "left bound");
  spec.window = Window{4, -3};
  expect_invalid(spec, "window", "4,-3", "right bound");
}

TEST(ValidateBias, AGradientNeedsABias) {
  AttentionSpec spec = good_spec();
  spec.bias_grad = true;
  expect_invalid(spec, "bias_grad", "1", "a bias");
  spec.bias = Bias::one_hss;
  EXPECT_NO_THROW(validate(spec));
}

TEST(ValidateDropout, ProbabilityInRangeAndAMaskOnlyWithDropout) {
  AttentionSpec spec = good_spec();
  for (double bad : {-0.1, 1.0, 1.5}) {
    spec.dropout = bad;
    expect_invalid(spec, "dropout", "", "[0, 1)");
  }
  spec.dropout = 0.0;
  spec.dropout_mask_out = true;
  expect_invalid(spec, "dropout_mask_out", "1", "dropout > 0");
  spec.dropout = 0.5;
  EXPECT_NO_THROW(validate(spec));
}

// A ValidatedSpec is the proof that get_plan and check_support take without validating again
// (fusedattn/attention.h): only validation makes one, and nothing changes it afterwards.
static_assert(!std::is_convertible_v<AttentionSpec, ValidatedSpec>, "made only by validating, never implicitly");
static_assert(!std::is_default_constructible_v<ValidatedSpec>, "no unchecked default one");
static_assert(!std::is_convertible_v<ValidatedSpec*, AttentionSpec*>, "its fields cannot be changed after the check");

TEST(ValidatedSpec, KeepsAValidSpecAsItIs) {
  const AttentionSpec spec = good_spec(Layout::thd_thd_thd);
  EXPECT_EQ(ValidatedSpec(spec).spec(), spec);
}

TEST(ValidatedSpec, RefusesWhatValidateRefusesInItsWords) {
  AttentionSpec spec = good_spec();
  spec.k.dims[kHead] = 3;
  spec.v.dims[kHead] = 3;
  std::string from_validate, from_proof;
  try {
    validate(spec);
  } catch (const InvalidArgument& e) {
    from_validate = e.what();
  }
  try {
    static_cast<void>(ValidatedSpec{spec});
  } catch (const InvalidArgument& e) {
    from_proof = e.what();
  }
  EXPECT_NE(from_validate.find("h_q = 8: a multiple of h_kv = 3"), std::string::npos) << from_validate;
  EXPECT_EQ(from_proof, from_validate);
}

}  // namespace
}  // namespace fusedattn
