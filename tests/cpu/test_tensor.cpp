// Tier 1: tensor descriptors — dtypes, the "bf16[dims]/[strides]" text form, extents, canonical strides.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/tensor.h"

namespace fusedattn {
namespace {

TensorDesc make_desc(DType dtype, std::array<std::int64_t, 4> dims, std::array<std::int64_t, 4> strides) {
  TensorDesc desc;
  desc.dtype = dtype;
  desc.dims = dims;
  desc.strides = strides;
  return desc;
}

TEST(TensorDType, SizesAndNames) {
  EXPECT_EQ(size_of(DType::f16), 2u);
  EXPECT_EQ(size_of(DType::bf16), 2u);
  EXPECT_STREQ(to_string(DType::f16), "f16");
  EXPECT_STREQ(to_string(DType::bf16), "bf16");
}

TEST(TensorDType, ParsesEveryAlias) {
  for (const char* text : {"f16", "fp16", "half", "float16", "FP16"}) EXPECT_EQ(parse_dtype(text, "dtype"), DType::f16) << text;
  for (const char* text : {"bf16", "bfloat16", "BF16"}) EXPECT_EQ(parse_dtype(text, "dtype"), DType::bf16) << text;
}

TEST(TensorDType, RejectsUnknownNamingTheField) {
  for (const char* text : {"fp32", "", "bf", "f16 "}) {
    try {
      parse_dtype(text, "q.dtype");
      FAIL() << "accepted " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.field(), "q.dtype");
      EXPECT_EQ(e.value(), text);
      EXPECT_NE(e.requirement().find("bf16"), std::string::npos);
    }
  }
}

TEST(TensorDesc, PrintsTheDocumentedForm) {
  TensorDesc desc = make_desc(DType::bf16, {2, 16, 1024, 128}, {2097152, 128, 2048, 1});
  EXPECT_EQ(to_string(desc), "bf16[2,16,1024,128]/[2097152,128,2048,1]");
  EXPECT_EQ(to_string(make_desc(DType::f16, {1, 1, 1, 8}, {8, 8, 8, 1})), "f16[1,1,1,8]/[8,8,8,1]");
}

TEST(TensorDesc, ParseInvertsPrint) {
  const std::vector<TensorDesc> descs = {
      make_desc(DType::bf16, {2, 16, 1024, 128}, {2097152, 128, 2048, 1}),
      make_desc(DType::f16, {3, 5, 7, 72}, {99991, 17, 4099, 1}),
      make_desc(DType::f16, {1, 2, 3, 8}, {-48, 24, 8, 1}),  // printing must not depend on validity
      make_desc(DType::bf16, {0, 0, 0, 0}, {0, 0, 0, 0}),
  };
  for (const TensorDesc& desc : descs) {
    EXPECT_EQ(parse_tensor_desc(to_string(desc), "q"), desc) << to_string(desc);
  }
  EXPECT_EQ(parse_tensor_desc("fp16[1,2,3,8]/[48,24,8,1]", "q").dtype, DType::f16);
}

TEST(TensorDesc, MalformedTextNamesTheField) {
  const std::vector<std::string> bad = {
      "",
      "bf16",
      "bf17[1,2,3,8]/[48,24,8,1]",
      "bf16[1,2,3]/[48,24,8,1]",
      "bf16[1,2,3,8,9]/[48,24,8,1]",
      "bf16[1,2,3,8]/[48,24,8]",
      "bf16[1,2,3,8]/[48,24,8,1",
      "bf16[1,2,3,8][48,24,8,1]",
      "bf16[1,2,x,8]/[48,24,8,1]",
      "bf16[1,2,3,8]/[48,24,8,1]x",
      "bf16[1,,3,8]/[48,24,8,1]",
      "bf16[1,2,3,8]/[48,24,8,99999999999999999999]",
      "bf16[ 1,2,3,8]/[48,24,8,1]",
  };
  for (const std::string& text : bad) {
    try {
      parse_tensor_desc(text, "k");
      FAIL() << "accepted " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.field(), "k") << text;
      EXPECT_EQ(e.value(), text);
      EXPECT_NE(e.requirement().find("bf16[b,h,s,d]"), std::string::npos) << e.what();
    }
  }
}

TEST(TensorDesc, ExtentSpansFirstToLastElement) {
  // Dense: extent == elements.
  TensorDesc dense = make_desc(DType::bf16, {2, 3, 5, 8}, {120, 40, 8, 1});
  EXPECT_EQ(dense.extent(), dense.elements());
  // bs3hd's K at b=2 s=5 h=3 d=8: last element at (1,2,4,7) = 360 + 16 + 288 + 7 = 671.
  TensorDesc packed = make_desc(DType::bf16, {2, 3, 5, 8}, {360, 8, 72, 1});
  EXPECT_EQ(packed.extent(), 672);
  // Negative strides reach below the first element; the span counts both sides.
  TensorDesc reversed = make_desc(DType::bf16, {1, 1, 4, 8}, {32, 32, -8, 1});
  EXPECT_EQ(reversed.extent(), 32);
  TensorDesc empty = make_desc(DType::bf16, {2, 0, 5, 8}, {120, 40, 8, 1});
  EXPECT_EQ(empty.extent(), 0);
}

TEST(TensorDesc, ContiguousBhsdStrides) {
  std::array<std::int64_t, 4> expected{3 * 5 * 8, 5 * 8, 8, 1};
  EXPECT_EQ(contiguous_bhsd_strides({2, 3, 5, 8}), expected);
  TensorDesc desc = make_desc(DType::f16, {2, 3, 5, 8}, contiguous_bhsd_strides({2, 3, 5, 8}));
  EXPECT_EQ(desc.extent(), desc.elements());
}

TEST(TensorDesc, EqualityLooksAtEveryPart) {
  TensorDesc base = make_desc(DType::bf16, {2, 3, 5, 8}, {120, 40, 8, 1});
  TensorDesc other = base;
  EXPECT_EQ(base, other);
  other.dtype = DType::f16;
  EXPECT_NE(base, other);
  other = base;
  other.dims[2] = 6;
  EXPECT_NE(base, other);
  other = base;
  other.strides[0] = 121;
  EXPECT_NE(base, other);
}

}  // namespace
}  // namespace fusedattn
