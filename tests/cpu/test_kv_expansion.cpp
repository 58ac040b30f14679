// Tier 1: when an FP8 backward runs its grouped K/V heads ungrouped (support/kv_expansion.h), with
// worked numbers for an H200's 132 SMs (8 waves: 1056 key tiles of 128), and the spec and
// workspace it then uses.
#include <gtest/gtest.h>

#include "fusedattn/layout.h"
#include "fusedattn/spec.h"
#include "support/kv_expansion.h"

namespace fusedattn::detail {
namespace {

constexpr int kH200 = 132;

AttentionSpec spec_of(std::int64_t b, std::int64_t s, std::int64_t h_q, std::int64_t h_kv,
                      DType dtype = DType::e4m3, Layout layout = Layout::bshd) {
  ProblemShape shape;
  shape.dtype = dtype;
  shape.batch = b;
  shape.seq_q = shape.seq_kv = s;
  shape.heads_q = h_q;
  shape.heads_kv = h_kv;
  shape.head_dim_qk = shape.head_dim_v = 128;
  AttentionSpec spec = spec_for_layout(layout, shape);
  spec.window = kCausal;
  return spec;
}

TEST(KvExpansion, TheMeasuredShapes) {
  // b=1 s=8k h 64/8: 1 * 8 * 64 = 512 tiles, 3.9 waves: ungrouped (7.53 ms grouped, 5.13 ungrouped).
  EXPECT_TRUE(expands_kv_heads(spec_of(1, 8192, 64, 8), Pass::backward, kH200));
  // b=1 s=32k h 32/8: 1 * 8 * 256 = 2048 tiles, 15.5 waves: stays grouped.
  EXPECT_FALSE(expands_kv_heads(spec_of(1, 32768, 32, 8), Pass::backward, kH200));
}

TEST(KvExpansion, TheBoundaryIsEightWaves) {
  // h_kv 8 and 131 tiles per head: 1048 < 1056; 132 tiles: 1056, not fewer.
  EXPECT_TRUE(expands_kv_heads(spec_of(1, 131 * 128, 32, 8), Pass::backward, kH200));
  EXPECT_FALSE(expands_kv_heads(spec_of(1, 132 * 128, 32, 8), Pass::backward, kH200));
  // A partial tile counts as one: 131 tiles and one key make 132.
  EXPECT_FALSE(expands_kv_heads(spec_of(1, 131 * 128 + 1, 32, 8), Pass::backward, kH200));
  // Fewer SMs, fewer tiles needed: 512 tiles are 8 waves of 64 SMs.
  EXPECT_FALSE(expands_kv_heads(spec_of(1, 8192, 64, 8), Pass::backward, 64));
}

TEST(KvExpansion, OnlyGroupedDenseFp8Backwards) {
  const AttentionSpec grouped = spec_of(1, 8192, 64, 8);
  EXPECT_FALSE(expands_kv_heads(grouped, Pass::forward, kH200));
  EXPECT_FALSE(expands_kv_heads(spec_of(1, 8192, 64, 8, DType::bf16), Pass::backward, kH200));  // 16-bit: no gain
  EXPECT_FALSE(expands_kv_heads(spec_of(1, 8192, 64, 64), Pass::backward, kH200));               // not grouped
  EXPECT_FALSE(expands_kv_heads(spec_of(1, 8192, 64, 8, DType::e4m3, Layout::thd_thd_thd), Pass::backward, kH200));
  EXPECT_FALSE(expands_kv_heads(grouped, Pass::backward, 0));  // no SM count
  AttentionSpec padded = grouped;
  padded.padding = true;  // rows past the lengths: the sums would read what cuDNN left there
  EXPECT_FALSE(expands_kv_heads(padded, Pass::backward, kH200));
  EXPECT_TRUE(expands_kv_heads(spec_of(1, 8192, 64, 8, DType::e5m2), Pass::backward, kH200));
  AttentionSpec mxfp8 = grouped;
  mxfp8.fp8_scaling = Fp8Scaling::mxfp8;  // its K copies and block scales are the caller's, grouped
  mxfp8.o.dtype = DType::bf16;
  EXPECT_FALSE(expands_kv_heads(mxfp8, Pass::backward, kH200));
}

TEST(KvExpansion, OnlyKvRowsIn16ByteUnits) {
  // The copies move 16 bytes at once: a K/V head stride of 136 FP8 elements keeps the backward grouped.
  AttentionSpec spec = spec_of(1, 8192, 64, 8);
  ASSERT_TRUE(in_16_byte_rows(spec.k));
  spec.k.strides = {8192 * 8 * 136, 136, 8 * 136, 1};
  spec.v = spec.k;
  EXPECT_FALSE(in_16_byte_rows(spec.k));
  EXPECT_FALSE(expands_kv_heads(spec, Pass::backward, kH200));
  spec.k.strides = {8192 * 8 * 144, 144, 8 * 144, 1};  // 144 bytes: nine chunks
  spec.v = spec.k;
  EXPECT_TRUE(expands_kv_heads(spec, Pass::backward, kH200));
}

TEST(KvExpansion, TheUngroupedSpecHasOneKvHeadPerQueryHead) {
  const AttentionSpec spec = spec_of(2, 1024, 16, 4, DType::e4m3, Layout::sbhd);
  const AttentionSpec expanded = kv_expanded_spec(spec);
  for (const TensorDesc* t : {&expanded.k, &expanded.v}) {
    EXPECT_EQ(t->dims, (std::array<std::int64_t, 4>{2, 16, 1024, 128}));
    EXPECT_EQ(t->strides, (std::array<std::int64_t, 4>{1024 * 16 * 128, 128, 16 * 128, 1}));  // [b, s, h, d]
    EXPECT_EQ(t->dtype, DType::e4m3);
  }
  EXPECT_EQ(expanded.q, spec.q);
  EXPECT_EQ(expanded.o, spec.o);
  EXPECT_EQ(expanded.window, spec.window);
  EXPECT_NO_THROW(validate(expanded));
}

TEST(KvExpansion, TheWorkspaceHoldsFourTensorsAndTwoAmaxes) {
  const AttentionSpec spec = spec_of(1, 1000, 16, 4);
  const KvExpansionLayout layout = kv_expansion_layout(spec);
  const std::size_t tensor = 1000 * 16 * 128;  // one byte per element; a multiple of 256 already
  EXPECT_EQ(layout.k, 0u);
  EXPECT_EQ(layout.v, tensor);
  EXPECT_EQ(layout.d_k, 2 * tensor);
  EXPECT_EQ(layout.d_v, 3 * tensor);
  EXPECT_EQ(layout.amax_d_k, 4 * tensor);
  EXPECT_EQ(layout.amax_d_v, 4 * tensor + sizeof(float));
  EXPECT_EQ(layout.bytes, 4 * tensor + 256);
  const KvExpansionLayout odd = kv_expansion_layout(spec_of(1, 3, 8, 2));  // 3 * 8 * 128 = 3072 bytes
  EXPECT_EQ(odd.v % 256, 0u);
  EXPECT_EQ(odd.bytes % 256, 0u);
}

}  // namespace
}  // namespace fusedattn::detail
