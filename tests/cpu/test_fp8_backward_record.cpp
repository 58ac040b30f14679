// Tier 1: the FP8 backward's choice as text — the specs it accepts, the model-precision spec it
// times against, its key, and the disk cache's record of it.
#include <gtest/gtest.h>

#include <string>

#include "fusedattn/errors.h"
#include "support/fp8_backward_record.h"

namespace fusedattn::detail {
namespace {

const char* const kFp8 = "layout=bshd dtype=e4m3 b=2 s=8192 h=16 d=128 causal";

std::string refused_field(const std::string& text, DType model = DType::bf16) {
  try {
    require_choosable(parse_spec(text), model);
  } catch (const InvalidArgument& error) {
    return error.field();
  }
  return "";
}

TEST(Fp8BackwardRecord, AcceptsDenseFp8SpecsAndNamesTheFieldOfOthers) {
  EXPECT_EQ(refused_field(kFp8), "");
  EXPECT_EQ(refused_field("layout=bshd dtype=e4m3 b=1 s=8192 h_q=64 h_kv=8 d=128 causal fp8_grads=e5m2"), "");
  EXPECT_EQ(refused_field(kFp8, DType::e4m3), "model_dtype");
  EXPECT_EQ(refused_field("layout=bshd dtype=bf16 b=2 s=256 h=4 d=128"), "q");
  EXPECT_EQ(refused_field("layout=bshd dtype=e4m3 b=2 s=256 h=4 d=128 padding=1"), "padding");
  EXPECT_EQ(refused_field("layout=bshd dtype=e4m3 b=2 s=256 h=4 d=128 dropout=0.1"), "dropout");
  EXPECT_EQ(refused_field("layout=thd_thd_thd dtype=e4m3 b=2 s=256 h=4 d=128 padding=1"), "layout");
}

TEST(Fp8BackwardRecord, ModelSpecTakesTheModelDtypeAndDropsTheGradientFormat) {
  const AttentionSpec fp8 = parse_spec(std::string(kFp8) + " fp8_grads=e5m2");
  const AttentionSpec model = model_precision_spec(fp8, DType::f16);
  for (const TensorDesc* desc : {&model.q, &model.k, &model.v, &model.o}) EXPECT_EQ(desc->dtype, DType::f16);
  EXPECT_EQ(model.fp8_gradients, Fp8Gradients::as_inputs);
  EXPECT_EQ(model.q.strides, fp8.q.strides);
  EXPECT_EQ(model.window, fp8.window);
  EXPECT_NO_THROW(validate(model));
}

TEST(Fp8BackwardRecord, KeyNamesTheModelDtypeAndTheSpec) {
  const AttentionSpec spec = parse_spec(kFp8);
  EXPECT_EQ(fp8_backward_key(spec, DType::bf16), "fp8_backward model=bf16 " + to_string(spec));
  EXPECT_NE(fp8_backward_key(spec, DType::bf16), fp8_backward_key(spec, DType::f16));
  EXPECT_NE(fp8_backward_key(spec, DType::bf16), fp8_backward_key(parse_spec(std::string(kFp8) + " fp8_grads=e5m2"),
                                                                   DType::bf16));
}

TEST(Fp8BackwardRecord, FasterTakesTheSmallerTimeAndTheModelWhereFp8DidNotRun) {
  EXPECT_EQ(faster(1.0, 2.0), Fp8Backward::fp8);
  EXPECT_EQ(faster(2.0, 1.0), Fp8Backward::model);
  EXPECT_EQ(faster(1.0, 1.0), Fp8Backward::model);
  EXPECT_EQ(faster(-1.0, 5.0), Fp8Backward::model);
  EXPECT_STREQ(to_string(Fp8Backward::fp8), "fp8");
  EXPECT_STREQ(to_string(Fp8Backward::model), "model");
}

TEST(Fp8BackwardRecord, RecordRoundTripsAndRefusesAnythingElse) {
  const Fp8BackwardChoice choice{Fp8Backward::fp8, 2.9071, 3.3452};
  EXPECT_EQ(to_record(choice), "fp8_ms=2.9071 model_ms=3.3452");
  const auto back = parse_record(to_record(choice));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->chosen, Fp8Backward::fp8);
  EXPECT_DOUBLE_EQ(back->fp8_ms, 2.9071);
  EXPECT_DOUBLE_EQ(back->model_ms, 3.3452);
  const auto not_run = parse_record("fp8_ms=-1.0000 model_ms=0.5000");
  ASSERT_TRUE(not_run.has_value());
  EXPECT_EQ(not_run->chosen, Fp8Backward::model);
  for (const char* bad : {"", "fp8_ms=1.0", "model_ms=1.0 fp8_ms=2.0", "fp8_ms=1.0 model_ms=2.0 extra",
                          "fp8_ms=nan model_ms=1.0", "fp8_ms=1.0 model_ms=0.0", "fp8_ms=1.0 model_ms=-2.0"}) {
    EXPECT_FALSE(parse_record(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace fusedattn::detail
