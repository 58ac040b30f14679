// The causal blocking rule for score-modified calls (src/support/causal_blocks.h), with worked numbers.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "fusedattn/score_mod.h"
#include "fusedattn/spec.h"
#include "support/causal_blocks.h"

namespace fusedattn::detail {
namespace {

constexpr const char* kSoftcap = "mul(tanh(div(score,$0)),$0)";

AttentionSpec modified(const std::string& text, const char* mod = kSoftcap) {
  return parse_spec(text + " score_mod=" + mod);
}

TEST(CausalBlocks, EightBlocksOfAtLeast1024Rows) {
  // s = 8192: 8 x 1024; 32768: 8 x 4096; 2048: 2 x 1024; 3000: 3 x 1024 (the last one 952 rows).
  const struct { int s; std::int64_t size, count; } cases[] = {{8192, 1024, 8}, {32768, 4096, 8}, {2048, 1024, 2},
                                                              {3000, 1024, 3}, {10000, 1280, 8}};
  for (const auto& c : cases) {
    const CausalBlocks blocks = causal_blocks(modified("layout=bshd b=2 s=" + std::to_string(c.s) + " h=16 d=128 causal"));
    EXPECT_EQ(blocks.size, c.size) << c.s;
    EXPECT_EQ(blocks.count, c.count) << c.s;
  }
  // 1024 rows or fewer: one call.
  EXPECT_FALSE(causal_blocks(modified("layout=bshd b=2 s=1024 h=16 d=128 causal")).split());
}

TEST(CausalBlocks, ForwardBlocksSeeThePrefixTheirRowsSee) {
  const AttentionSpec spec = modified("layout=bshd b=2 s=8192 h=16 d=128 causal", "add(score,mul(t0[h],sub(kv,q)))");
  const CausalBlocks blocks = causal_blocks(spec);
  const AttentionSpec third = forward_block(spec, blocks, 3);  // rows 3072 .. 4095
  EXPECT_EQ(forward_first_row(blocks, 3), 3072);
  EXPECT_EQ(third.seq_q(), 1024);
  EXPECT_EQ(third.seq_kv(), 4096);
  EXPECT_EQ(third.window, kCausal);
  EXPECT_EQ(third.alignment, Alignment::bottom_right);  // its last row sees its last key
  EXPECT_EQ(to_string(third.score_mod), "add(score,mul(t0[h],sub(kv,add(q,3072))))");  // the whole problem's q
  EXPECT_EQ(third.q.strides, spec.q.strides);  // a view: the caller's strides
  EXPECT_NO_THROW(validate(third));
}

TEST(CausalBlocks, BackwardBlocksTakeTheQueriesThatSeeTheirKeys) {
  // Bottom-right, s_q = 2048, s_kv = 3000: shift 952; 3 key blocks.
  const AttentionSpec spec = modified("layout=bshd b=1 s_q=2048 s_kv=3000 h=4 d=64 causal align=bottom_right");
  const CausalBlocks blocks = causal_blocks(spec);
  ASSERT_EQ(blocks.count, 2);
  EXPECT_EQ(forward_block(spec, blocks, 1).seq_kv(), 3000);  // rows 1024 .. 2047 see every key
  ASSERT_EQ(backward_count(spec, blocks), 3);
  const struct { std::int64_t key, row, rows, keys, right; } want[] = {
      {0, 0, 2048, 1024, 952},      // keys 0 .. 1023: every query, the first 72 rows' diagonal past them
      {1024, 72, 1976, 1024, 0},    // keys 1024 ..: from row 1024 - 952 = 72 on, causal in the block
      {2048, 1096, 952, 952, 0}};   // the last 952 keys
  for (std::int64_t j = 0; j < 3; ++j) {
    const AttentionSpec block = backward_block(spec, blocks, j);
    EXPECT_EQ(backward_first_key(blocks, j), want[j].key);
    EXPECT_EQ(backward_first_row(spec, blocks, j), want[j].row);
    EXPECT_EQ(block.seq_q(), want[j].rows);
    EXPECT_EQ(block.seq_kv(), want[j].keys);
    EXPECT_EQ(block.window, (Window{-1, want[j].right}));
    EXPECT_EQ(block.alignment, Alignment::top_left);
    EXPECT_NO_THROW(validate(block));
  }
  EXPECT_EQ(to_string(backward_block(spec, blocks, 2).score_mod), kSoftcap);  // no index: nothing to shift
}

TEST(CausalBlocks, OneCallWhereABlockCouldNotBeAView) {
  const char* one_call[] = {
      "layout=bshd b=2 s=4096 h=8 d=128",                               // not causal
      "layout=bshd b=2 s=4096 h=8 d=128 window=256,0",                  // a sliding window
      "layout=bshd b=2 s=4096 h=8 d=128 causal padding=1",              // lengths
      "layout=bshd b=2 s=4096 h=8 d=128 causal bias=1hss",              // a bias over the scores
      "layout=bshd b=2 s=4096 h=8 d=128 causal dropout=0.1",
      "layout=bshd b=2 s=4096 h=8 d=128 causal softmax=sink",
      "layout=bshd b=2 s_q=4096 s_kv=5000 h=8 d=128 causal",            // top-left with s_q != s_kv
      "layout=bshd b=2 s_q=5000 s_kv=4096 h=8 d=128 causal align=bottom_right",  // rows that see nothing
      "layout=bshd dtype=e4m3 b=2 s=4096 h=8 d=128 causal",
  };
  for (const char* text : one_call) EXPECT_FALSE(causal_blocks(modified(text)).split()) << text;
  EXPECT_FALSE(causal_blocks(parse_spec("layout=bshd b=2 s=4096 h=8 d=128 causal")).split());  // no modifier
  // Tensors: over the batch and heads, the queries alone or the keys alone are views; [h, kv] is not.
  for (const char* mod : {"add(score,t0[b,h])", "mul(score,t0[q])", "add(score,t0[kv])"}) {
    EXPECT_TRUE(causal_blocks(modified("layout=bshd b=2 s=4096 h=8 d=128 causal", mod)).split()) << mod;
  }
  EXPECT_FALSE(causal_blocks(modified("layout=bshd b=2 s=4096 h=8 d=128 causal", "add(score,t0[h,kv])")).split());
  // A tensor along the queries with a shift of 951: backward rows start 1024 - 951 = 73 floats in,
  // which is not 16-byte aligned; 952 is.
  const char* shifted = "layout=bshd b=1 s_q=2048 s_kv=%d h=4 d=64 causal align=bottom_right";
  char text[128];
  std::snprintf(text, sizeof text, shifted, 2999);
  EXPECT_FALSE(causal_blocks(modified(text, "mul(score,t0[q])")).split());
  std::snprintf(text, sizeof text, shifted, 3000);
  EXPECT_TRUE(causal_blocks(modified(text, "mul(score,t0[q])")).split());
}

}  // namespace
}  // namespace fusedattn::detail
