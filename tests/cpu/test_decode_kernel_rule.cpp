// The decode kernel's rule (src/support/decode_kernel_rule.h): what the kernel takes (every reason
// it refuses), its row tiles and shared memory, the cut its cost model picks with the numbers worked
// by hand for an H200, when it is preferred over cuDNN's path, and the FP8 K/V cache's spec checks
// and support reasons.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"
#include "support/decode_kernel_rule.h"

namespace fusedattn::detail {
namespace {

const DecodeDevice kH200{DeviceCaps{9, 0}, 132};

AttentionSpec paged(const std::string& shape, const std::string& extra = " causal align=bottom_right") {
  AttentionSpec spec =
      parse_spec("layout=bshd_paged_bshd dtype=bf16 h_q=32 h_kv=8 d=128 page_size=64 pages=4096 " + shape + extra);
  validate(spec);
  return spec;
}

AttentionSpec with_fp8_cache(AttentionSpec spec, Fp8Scaling scaling = Fp8Scaling::tensor) {
  spec.k.dtype = spec.v.dtype = DType::e4m3;
  spec.fp8_scaling = scaling;
  return spec;
}

std::vector<std::string> fields_of(const std::vector<Reason>& reasons) {
  std::vector<std::string> out;
  for (const Reason& reason : reasons) out.push_back(reason.field);
  return out;
}

TEST(DecodeKernelRule, TakesDecodesOfOneToSixteenQueriesPagedOrContiguous) {
  for (const char* shape : {"b=1 s_q=1 s_kv=8192", "b=8 s_q=16 s_kv=2048", "b=3 s_q=7 s_kv=1024"}) {
    EXPECT_TRUE(decode_kernel_refusals(paged(shape), Pass::forward, kH200.caps).empty()) << shape;
  }
  AttentionSpec contiguous =
      parse_spec("layout=bshd dtype=f16 b=2 s_q=4 s_kv=4096 h_q=16 h_kv=2 d=64 padding=1 window=128,0 align=bottom_right");
  validate(contiguous);
  EXPECT_TRUE(decode_kernel_refusals(contiguous, Pass::forward, kH200.caps).empty());
  EXPECT_TRUE(decode_kernel_refusals(with_fp8_cache(paged("b=1 s_q=1 s_kv=8192")), Pass::forward, kH200.caps).empty());
  // gpt-oss's sinks (h 64/8, d 64, a window of 128) and off-by-one: a term added to the denominator.
  AttentionSpec sinks = parse_spec("layout=bshd dtype=bf16 b=2 s_q=1 s_kv=1500 h_q=64 h_kv=8 d=64 padding=1 "
                                   "softmax=sink window=128,0 align=bottom_right");
  validate(sinks);
  EXPECT_TRUE(decode_kernel_refusals(sinks, Pass::forward, kH200.caps).empty());
  sinks.softmax = Softmax::off_by_one;
  EXPECT_TRUE(decode_kernel_refusals(sinks, Pass::forward, kH200.caps).empty());
}

// Every reason at once, each naming its field and saying the kernel is what refuses it.
TEST(DecodeKernelRule, RefusesWithEveryReason) {
  AttentionSpec spec = paged("b=1 s_q=1 s_kv=8192");
  spec.q.dims[kDim] = 96;
  spec.alibi = true;
  spec.dropout = 0.1;
  spec.max_logit = MaxLogit::row;
  const std::vector<Reason> reasons = decode_kernel_refusals(spec, Pass::backward, DeviceCaps{7, 5});
  const std::vector<std::string> expected = {"pass", "device", "d_qk", "alibi", "dropout", "max_logit"};
  EXPECT_EQ(fields_of(reasons), expected);
  for (const Reason& reason : reasons) {
    EXPECT_NE(reason.requirement.find("in fusedattn's decode kernel"), std::string::npos) << reason.requirement;
  }
  EXPECT_EQ(reasons[2].value, "96 (d_v 128)");
}

// A decode step's bias (transformers' padding mask and window as one row of keys, [b, 1, 1, s_kv],
// or any broadcast shape): taken, and preferred for inference, where cuDNN's call over a contiguous
// cache streams every key from one block and needs a plan for every length.
TEST(DecodeKernelRule, TakesABiasAndPrefersItForInference) {
  for (const char* bias : {"b1ss", "bhss", "111s", "1hss"}) {
    AttentionSpec spec = parse_spec(std::string("layout=bshd dtype=bf16 b=16 s_q=1 s_kv=8257 h_q=32 h_kv=8 d=128 "
                                                "bias=") + bias);
    validate(spec);
    EXPECT_TRUE(decode_kernel_refusals(spec, Pass::forward, kH200.caps).empty()) << bias;
    EXPECT_TRUE(decode_kernel_preferred(spec, Pass::forward, kH200)) << bias;
    spec.score_mod = parse_score_mod("mul($0,tanh(div(score,$0)))");  // Gemma 2's softcap beside it
    EXPECT_TRUE(decode_kernel_refusals(spec, Pass::forward, kH200.caps).empty()) << bias;
  }
}

// Gemma 2's decode: d 256, h 8/4, its softcap and a window of 4096 on alternate layers, a bias for a
// padded batch. Taken where an SM has room for its 192 KB of stages (one block an SM), refused naming
// the room where it has not (SM 8.6: 100 KB).
TEST(DecodeKernelRule, TakesAHeadDimOf256WhereTheStagesFit) {
  AttentionSpec gemma = parse_spec("layout=bshd dtype=bf16 b=1 s_q=1 s_kv=8192 h_q=8 h_kv=4 d=256 window=4096,0 "
                                   "align=bottom_right padding=1 score_mod=mul($0,tanh(div(score,$0)))");
  validate(gemma);
  EXPECT_TRUE(decode_kernel_refusals(gemma, Pass::forward, kH200.caps).empty());
  const DecodeKernelShape shape = decode_kernel_shape(gemma, kH200);
  EXPECT_EQ(shape.shared_bytes, 3 * 2 * 64 * 256 * 2);
  EXPECT_EQ(shape.blocks_per_sm, 1);
  EXPECT_GT(shape.chunks, 1);  // 4 K/V heads alone would leave most SMs idle
  EXPECT_EQ(fields_of(decode_kernel_refusals(gemma, Pass::forward, DeviceCaps{8, 6})),
            std::vector<std::string>{"device"});
  gemma.q.dims[kDim] = gemma.k.dims[kDim] = gemma.v.dims[kDim] = gemma.o.dims[kDim] = 192;
  EXPECT_EQ(fields_of(decode_kernel_refusals(gemma, Pass::forward, kH200.caps)), std::vector<std::string>{"d_qk"});
}

// A softcap is the one modifier the kernel applies: its cap a runtime scalar or a constant, written
// either way round, the same cap inside and out; anything else is refused naming the modifier.
TEST(DecodeKernelRule, TakesASoftcapAndNoOtherScoreModifier) {
  const std::optional<DecodeSoftcap> scalar = decode_softcap(parse_score_mod("mul($0,tanh(div(score,$0)))"));
  ASSERT_TRUE(scalar.has_value());
  EXPECT_EQ(scalar->scalar_slot, 0);
  const std::optional<DecodeSoftcap> constant = decode_softcap(parse_score_mod("mul(tanh(div(score,30)),30)"));
  ASSERT_TRUE(constant.has_value());
  EXPECT_EQ(constant->scalar_slot, -1);
  EXPECT_EQ(constant->constant, 30.0);
  for (const char* other : {"mul($0,tanh(div(score,$1)))", "mul(30,tanh(div(score,50)))", "mul($0,tanh(score))",
                            "mul($0,sigmoid(div(score,$0)))", "add(score,$0)", "mul($0,tanh(div(h,$0)))",
                            "mul(30,tanh(div(score,-30)))"}) {
    EXPECT_FALSE(decode_softcap(parse_score_mod(other)).has_value()) << other;
  }
  AttentionSpec capped = paged("b=1 s_q=1 s_kv=8192");
  capped.score_mod = parse_score_mod("mul($0,tanh(div(score,$0)))");
  EXPECT_TRUE(decode_kernel_refusals(capped, Pass::forward, kH200.caps).empty());
  // The only path for a softcap: preferred over paged caches too, where cuDNN's takes no modifier.
  EXPECT_TRUE(decode_kernel_preferred(capped, Pass::forward, kH200));
  capped.score_mod = parse_score_mod("add(score,mul(t0[h],sub(kv,q)))");
  const std::vector<Reason> reasons = decode_kernel_refusals(capped, Pass::forward, kH200.caps);
  ASSERT_EQ(fields_of(reasons), std::vector<std::string>{"score_mod"});
  EXPECT_NE(reasons[0].requirement.find("but a softcap"), std::string::npos) << reasons[0].requirement;
}

// cuDNN 9.19 returned wrong rows for a modifier on one query row with runtime lengths (the H200):
// the policy refuses such a call unless the kernel runs it, naming what keeps the kernel away.
TEST(DecodeKernelRule, AModifierOnOneQueryRowWithLengthsRunsOnTheKernelOrNowhere) {
  const Versions cudnn{91900, 91900, 13200};
  auto padded = [](const std::string& extra) {
    AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=3 s_q=1 s_kv=3000 h_q=8 h_kv=4 d=128 padding=1 causal "
                                    "align=bottom_right " + extra);
    validate(spec);
    return spec;
  };
  const AttentionSpec softcap = padded("score_mod=mul($0,tanh(div(score,$0)))");
  EXPECT_TRUE(check_support_policy(softcap, Pass::forward, kH200.caps, cudnn).ok());
  const AttentionSpec relative = padded("score_mod=add(score,mul($0,sub(kv,q)))");
  const Support refused = check_support_policy(relative, Pass::forward, kH200.caps, cudnn);
  ASSERT_EQ(fields_of(refused.reasons), std::vector<std::string>{"score_mod"});
  EXPECT_NE(refused.reasons[0].requirement.find("cuDNN 9.19 returns wrong rows there"), std::string::npos);
  EXPECT_NE(refused.reasons[0].requirement.find("score_mod = add(score"), std::string::npos)
      << refused.reasons[0].requirement;
  // Two query rows, or no runtime lengths: cuDNN's path (checked right on the H200).
  AttentionSpec two_rows = parse_spec("layout=bshd dtype=bf16 b=3 s_q=2 s_kv=3000 h_q=8 h_kv=4 d=128 padding=1 "
                                      "score_mod=add(score,mul($0,sub(kv,q)))");
  validate(two_rows);
  EXPECT_TRUE(check_support_policy(two_rows, Pass::forward, kH200.caps, cudnn).ok());
  AttentionSpec fixed = relative;
  fixed.padding = false;
  EXPECT_TRUE(check_support_policy(fixed, Pass::forward, kH200.caps, cudnn).ok());
}

TEST(DecodeKernelRule, RefusesRowsPastOneBlockAndPagesOffSixteen) {
  // 17 queries; 16 queries of a group of 16 (256 rows); pages of 40 tokens; ragged queries.
  EXPECT_EQ(fields_of(decode_kernel_refusals(paged("b=1 s_q=17 s_kv=4096"), Pass::forward, kH200.caps)),
            std::vector<std::string>{"s_q"});
  AttentionSpec wide = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1 s_q=16 s_kv=4096 h_q=32 h_kv=2 d=128 "
                                  "page_size=64 pages=64 causal align=bottom_right");
  const std::vector<Reason> rows = decode_kernel_refusals(wide, Pass::forward, kH200.caps);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].value, "16 (h_q / h_kv = 16)");
  AttentionSpec odd_pages = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1 s_q=1 s_kv=4000 h_q=8 h_kv=8 d=64 "
                                       "page_size=40 pages=100");
  EXPECT_EQ(fields_of(decode_kernel_refusals(odd_pages, Pass::forward, kH200.caps)),
            std::vector<std::string>{"page_size"});
  AttentionSpec ragged = parse_spec("layout=thd_paged_bshd dtype=bf16 b=2 s_q=1 s_kv=4096 h_q=8 h_kv=8 d=64 "
                                    "page_size=64 pages=64");
  EXPECT_EQ(fields_of(decode_kernel_refusals(ragged, Pass::forward, kH200.caps)), std::vector<std::string>{"layout"});
}

// Rows: the g query heads of a K/V head times s_q, in tiles of 16; fewer than 4 tiles share their
// keys among 4 warps in all. Up to 8 rows the keys are the products' M.
TEST(DecodeKernelRule, RowTilesWarpsAndSharedMemory) {
  struct Case {
    const char* shape;
    int row_tiles, key_groups, threads, blocks_per_sm;
    bool keys_as_m;
  };
  const Case cases[] = {
      {"b=1 s_q=1 s_kv=8192", 1, 4, 128, 2, true},    // 4 rows
      {"b=1 s_q=2 s_kv=8192", 1, 4, 128, 2, true},    // 8 rows
      {"b=1 s_q=3 s_kv=8192", 1, 4, 128, 2, false},   // 12 rows
      {"b=1 s_q=5 s_kv=8192", 2, 2, 128, 2, false},   // 20 rows
      {"b=1 s_q=16 s_kv=8192", 4, 1, 128, 2, false},  // 64 rows
  };
  for (const Case& c : cases) {
    const DecodeKernelShape shape = decode_kernel_shape(paged(c.shape), kH200);
    EXPECT_EQ(shape.row_tiles, c.row_tiles) << c.shape;
    EXPECT_EQ(shape.keys_as_m, c.keys_as_m) << c.shape;
    EXPECT_EQ(shape.key_groups, c.key_groups) << c.shape;
    EXPECT_EQ(shape.threads, c.threads) << c.shape;
    EXPECT_EQ(shape.blocks_per_sm, c.blocks_per_sm) << c.shape;
    // 3 stages of a 64-key K and V tile at d 128 in bf16, 3 * 2 * 64 * 128 * 2 bytes, then the
    // chunk's pages of K's and V's tables (int32 each).
    EXPECT_EQ(shape.page_slots, shape.chunk_keys / 64 + 1) << c.shape;
    EXPECT_EQ(shape.shared_bytes, 98304 + 2 * 4 * shape.page_slots) << c.shape;
  }
  // 16 queries of a group of 8 are 128 rows: 8 tiles, a warp each, 256 threads, one block an SM
  // (256 registers a thread).
  AttentionSpec eight = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1 s_q=16 s_kv=4096 h_q=64 h_kv=8 d=128 "
                                   "page_size=64 pages=64 causal align=bottom_right");
  const DecodeKernelShape big = decode_kernel_shape(eight, kH200);
  EXPECT_EQ(big.row_tiles, 8);
  EXPECT_EQ(big.threads, 256);
  EXPECT_EQ(big.blocks_per_sm, 1);
  // FP8 tiles: 4 stages of 1-byte tiles and the 16-bit copies of the one in use: 4 * 2 * 8192 + 2 * 16384;
  // 32 chunks of 256 keys span 5 pages each (of K, and of V).
  EXPECT_EQ(decode_kernel_shape(with_fp8_cache(paged("b=1 s_q=1 s_kv=8192")), kH200).shared_bytes, 98304 + 2 * 4 * 5);
  // A contiguous cache keeps no pages.
  AttentionSpec contiguous = parse_spec("layout=bshd dtype=bf16 b=1 s_q=1 s_kv=8192 h_q=32 h_kv=8 d=128");
  EXPECT_EQ(decode_kernel_shape(contiguous, kH200).page_slots, 0);
  EXPECT_EQ(decode_kernel_shape(contiguous, kH200).shared_bytes, 98304);
  EXPECT_EQ(decode_kernel_shared_bytes(64, 2, 4), 49152);  // d 64: half the tiles; rows 4 * 16 * 72 * 4 + 512 below
}

// A paged chunk spans at most kDecodeKernelMaxChunkPages pages (its table entries live in shared
// memory). 64 sequences of 32k keys fill the GPU with one chunk each (512 blocks): in pages of 64 one
// chunk spans 513 pages and stays whole; in pages of 16 it would span 2,049, and two chunks of 16,384
// keys 1,025 each, so the cut takes three of 10,944 keys (685 pages).
TEST(DecodeKernelRule, PagedChunksKeepTheirPagesInSharedMemory) {
  auto pages_of = [](int page_size) {
    AttentionSpec spec = parse_spec("layout=bshd_paged_bshd dtype=bf16 h_q=32 h_kv=8 d=128 page_size=" +
                                    std::to_string(page_size) + " pages=" + std::to_string(64 * 32768 / page_size) +
                                    " b=64 s_q=1 s_kv=32768 causal align=bottom_right");
    validate(spec);
    return decode_kernel_shape(spec, kH200);
  };
  const DecodeKernelShape whole = pages_of(64);
  EXPECT_EQ(whole.chunks, 1);
  EXPECT_EQ(whole.page_slots, 513);
  const DecodeKernelShape cut = pages_of(16);
  EXPECT_EQ(cut.chunks, 3);
  EXPECT_EQ(cut.chunk_keys, 10944);
  EXPECT_EQ(cut.page_slots, 685);
  EXPECT_EQ(cut.shared_bytes, 98304 + 2 * 4 * 685);
  EXPECT_EQ(cut.blocks_per_sm, 2);  // 2 * (98,304 + 5,480 + 1,024) bytes of the SM's 233,472
}

// b = 1, h 32/8, d 128, one query over 8k keys on 132 SMs (kSmBytesPerUs = 4.22e6 / 132 = 31,970
// bytes a microsecond; 264 block slots, two an SM). A K/V head streams 8192 * 2 * 128 * 2 = 4,194,304
// bytes: memory 8 * 4,194,304 / (132 * 31,970) = 7.95 us for any cut of 66 blocks or more (an SM
// draws up to 2 * 31,970 = 63,939, kSmMostShare). Its 4 rows take the keys as M: a block draws 2 *
// 32,768 / 1.36 = 48,188 bytes a microsecond (kKeysAsMTileUs), and each chunk writes 4 rows * 129 * 4
// = 2,064 bytes of partials. 32 chunks of 256 keys: 256 blocks, two on the busiest SM, 2 * (131,072
// + 2,064) / 63,939 = 4.16 us, below the memory's; so 1.5 + 7.95 + 1.8 (merge) = 11.25 us. 16 of 512
// (one block an SM: 264,208 / 48,188 = 5.48), 26 of 320 (5.19) and 19 of 448 (7.24) tie at 11.25:
// among equal times the busiest SM's 4.16 wins. 64 of 128 take two waves, the second paying its
// first round trip again (kWaveStartUs): 11.85.
// 8 chunks merged in clusters (64 blocks, 524,288 / 48,188 = 10.88) take 1.5 + 10.88 + 0.5 = 12.88.
TEST(DecodeKernelRule, WorkedCutOnAnH200) {
  const AttentionSpec spec = paged("b=1 s_q=1 s_kv=8192");
  const DecodeKernelShape shape = decode_kernel_shape(spec, kH200);
  EXPECT_EQ(shape.chunks, 32);
  EXPECT_EQ(shape.chunk_keys, 256);
  EXPECT_FALSE(shape.cluster_merge);  // more chunks than a cluster holds
  EXPECT_NEAR(decode_kernel_expected_us(spec, shape, kH200), 11.25, 0.01);
  EXPECT_EQ(decode_kernel_description(shape), "fusedattn decode kernel, 32 chunks of 256 keys merged");
  for (const auto& [chunks, us] :
       {std::pair{16, 11.25}, std::pair{26, 11.25}, std::pair{19, 11.25}, std::pair{64, 11.85}, std::pair{8, 12.88}}) {
    EXPECT_NEAR(decode_kernel_expected_us(spec, *decode_kernel_cut(spec, kH200, chunks), kH200), us, 0.01) << chunks;
  }
  // b = 64 over 2k keys: 512 blocks of one chunk already fill the GPU; one chunk, no merge.
  const DecodeKernelShape full = decode_kernel_shape(paged("b=64 s_q=1 s_kv=2048"), kH200);
  EXPECT_EQ(full.chunks, 1);
  EXPECT_FALSE(full.merged());
  EXPECT_EQ(decode_kernel_description(full), "fusedattn decode kernel, 1 chunk of 2048 keys");
}

// An FP8 cache at b = 2 over 8k keys: 16 (sequence, K/V head) pairs of 8,192 keys * 2 * 128 bytes,
// memory 16 * 2,097,152 / (132 * 31,970) = 7.95 us. Its blocks go at kFp8BlockBytesPerUs, 10,400 a
// microsecond, two on an SM 20,800. 16 chunks of 512 keys: 256 blocks, two on the busiest SM, 2 *
// (131,072 + 2,064) / 20,800 = 12.80 us, so 1.5 + 12.80 + 1.8 = 16.10. 8 chunks (one block an SM,
// 264,208 / 10,400 = 25.40) take 1.5 + 25.40 + 1.8 = 28.70: at the 16-bit rate 8 chunks won, and
// in clusters measured 33.6 us against 16 chunks' 22.9 on an H100. 32 chunks of 256 keys: 512 blocks
// in two waves, 1.5 + 0.6 + 2 * 2 * (65,536 + 2,064) / 20,800 + 1.8 = 16.90.
TEST(DecodeKernelRule, WorkedFp8CutOnAnH200) {
  const AttentionSpec spec = with_fp8_cache(paged("b=2 s_q=1 s_kv=8192"));
  const DecodeKernelShape shape = decode_kernel_shape(spec, kH200);
  EXPECT_EQ(shape.chunks, 16);
  EXPECT_FALSE(shape.cluster_merge);
  EXPECT_NEAR(decode_kernel_expected_us(spec, shape, kH200), 16.10, 0.01);
  EXPECT_NEAR(decode_kernel_expected_us(spec, *decode_kernel_cut(spec, kH200, 8), kH200), 28.70, 0.01);
  EXPECT_NEAR(decode_kernel_expected_us(spec, *decode_kernel_cut(spec, kH200, 32), kH200), 16.90, 0.01);
}

// A cut forced for measuring (FUSEDATTN_DECODE_CHUNKS): whole tiles, so 33 chunks of 8k keys are 32
// of 256; 1 to one tile a chunk; nothing where a chunk's pages overflow its slots (one chunk of 32k
// keys in 16-key pages spans 2,049, one of two 1,025).
TEST(DecodeKernelRule, ACutForcedForMeasuring) {
  const AttentionSpec spec = paged("b=1 s_q=1 s_kv=8192");
  const std::optional<DecodeKernelShape> fine = decode_kernel_cut(spec, kH200, 33);
  ASSERT_TRUE(fine.has_value());
  EXPECT_EQ(fine->chunks, 32);
  EXPECT_EQ(fine->chunk_keys, 256);
  EXPECT_FALSE(fine->cluster_merge);  // more chunks than a cluster holds
  EXPECT_EQ(decode_kernel_cut(spec, kH200, 0)->chunks, 1);
  EXPECT_EQ(decode_kernel_cut(spec, kH200, 1000)->chunk_keys, 64);
  EXPECT_TRUE(decode_kernel_cut(spec, kH200, 4)->cluster_merge);
  AttentionSpec small_pages = parse_spec(
      "layout=bshd_paged_bshd dtype=bf16 h_q=32 h_kv=8 d=128 page_size=16 pages=2048 b=1 s_q=1 s_kv=32768 causal "
      "align=bottom_right");
  validate(small_pages);
  EXPECT_FALSE(decode_kernel_cut(small_pages, kH200, 1).has_value());
  EXPECT_TRUE(decode_kernel_cut(small_pages, kH200, 3).has_value());  // 685 pages a chunk
}

// Merged in the kernel where that was measured faster (decode_cluster_merge): 2 to 8 chunks of at
// most 2 row tiles and at most 66 blocks (half the 132 SMs). Over 512 keys at b = 1 the cut is 8
// chunks of one tile (64 blocks): a cluster each (K/V head), 1.5 + 32,768 / 48,188 + 0.5 = 2.68 us
// (memory 8 * 262,144 / (128 * 31,970) = 0.51 binds less). Over 2k keys 8 chunks of 256 keys in clusters (one block an SM: 1.5 + 131,072 / 48,188 + 0.5
// = 4.72 us) beat 32 of one tile through the merge kernel (1.5 + 8 * 1,048,576 / (132 * 31,970) + 1.8
// = 5.29). b = 8 over 8k: 2 chunks of 4,096 keys (128 blocks) no longer merge in clusters (called
// eagerly they ran slower than through the merge kernel), so they tie with 4 at 1.5 + 268,435,456 /
// (132 * 31,970) + 1.8 = 66.91, and 4 (256 blocks, the busiest SM's 2 * 1,050,640 / 63,939 = 32.86
// against one block's 2,099,216 / 48,188 = 43.56) win. With 16 queries at b = 4 (4 row tiles) no cut
// merges in clusters. On SM 8.0 there are no clusters.
TEST(DecodeKernelRule, MergedInTheKernelWhereClustersFit) {
  const DecodeKernelShape shortest = decode_kernel_shape(paged("b=1 s_q=1 s_kv=512"), kH200);
  EXPECT_EQ(shortest.chunks, 8);
  EXPECT_TRUE(shortest.cluster_merge);
  EXPECT_EQ(decode_kernel_description(shortest), "fusedattn decode kernel, 8 chunks of 64 keys merged in the kernel");
  EXPECT_NEAR(decode_kernel_expected_us(paged("b=1 s_q=1 s_kv=512"), shortest, kH200), 2.68, 0.01);
  const AttentionSpec two_k = paged("b=1 s_q=1 s_kv=2048");
  const DecodeKernelShape short_cache = decode_kernel_shape(two_k, kH200);
  EXPECT_EQ(short_cache.chunks, 8);
  EXPECT_TRUE(short_cache.cluster_merge);
  EXPECT_NEAR(decode_kernel_expected_us(two_k, short_cache, kH200), 4.72, 0.01);
  const DecodeKernelShape finest = *decode_kernel_cut(two_k, kH200, 32);
  EXPECT_FALSE(finest.cluster_merge);
  EXPECT_NEAR(decode_kernel_expected_us(two_k, finest, kH200), 5.29, 0.01);
  const AttentionSpec batch = paged("b=8 s_q=1 s_kv=8192");
  const DecodeKernelShape batched = decode_kernel_shape(batch, kH200);
  EXPECT_EQ(batched.chunks, 4);
  EXPECT_FALSE(batched.cluster_merge);
  EXPECT_NEAR(decode_kernel_expected_us(batch, batched, kH200), 66.91, 0.01);
  const DecodeKernelShape two = *decode_kernel_cut(batch, kH200, 2);
  EXPECT_FALSE(two.cluster_merge);  // 128 blocks
  EXPECT_NEAR(decode_kernel_expected_us(batch, two, kH200), 66.91, 0.01);
  const AttentionSpec many_rows = paged("b=4 s_q=16 s_kv=8192");
  EXPECT_EQ(decode_kernel_shape(many_rows, kH200).chunks, 8);
  EXPECT_FALSE(decode_kernel_shape(many_rows, kH200).cluster_merge);
  EXPECT_FALSE(decode_kernel_cut(many_rows, kH200, 4)->cluster_merge);  // 128 blocks, but 4 row tiles
  EXPECT_FALSE(decode_kernel_shape(with_fp8_cache(many_rows), kH200).cluster_merge);  // 147.3 us in clusters at b7777ee
  EXPECT_FALSE(decode_kernel_shape(paged("b=1 s_q=1 s_kv=512"), DecodeDevice{DeviceCaps{8, 0}, 108}).cluster_merge);
  EXPECT_FALSE(decode_kernel_shape(paged("b=64 s_q=1 s_kv=2048"), kH200).cluster_merge);  // one chunk: no merge
}

// What was measured (decode_kernel_rule.cpp): paged caches faster on the kernel with 8 rows or fewer
// at every length and batch; with one row tile of more rows over up to 8k keys, or with up to 8
// (sequence, K/V head) pairs, on cuDNN's split decode past them; contiguous ones on the kernel from 2k
// keys, and at every length for inference (a growing cache builds no plan a step); FP8 caches have no
// other path.
TEST(DecodeKernelRule, PreferredWhereMeasuredFaster) {
  auto contiguous = [](const char* shape) {
    AttentionSpec spec = parse_spec(std::string("layout=bshd dtype=bf16 h_q=32 h_kv=8 d=128 padding=1 ") + shape);
    validate(spec);
    return spec;
  };
  for (const char* shape : {"b=1 s_q=1 s_kv=2048", "b=8 s_q=1 s_kv=32768", "b=4 s_q=16 s_kv=8192"}) {
    EXPECT_TRUE(decode_kernel_preferred(contiguous(shape), Pass::forward, kH200)) << shape;
  }
  // Paged, h 32/8: b = 1 is 8 pairs; 2 queries of a group of 4 are 8 rows, 4 one row tile of 16, 5
  // two.
  for (const char* shape : {"b=1 s_q=1 s_kv=512", "b=1 s_q=1 s_kv=32768", "b=1 s_q=4 s_kv=8192", "b=2 s_q=1 s_kv=8192",
                            "b=64 s_q=1 s_kv=8192", "b=8 s_q=1 s_kv=32768", "b=8 s_q=2 s_kv=32768",
                            "b=2 s_q=4 s_kv=8192"}) {
    EXPECT_TRUE(decode_kernel_preferred(paged(shape), Pass::forward, kH200)) << shape;
  }
  for (const char* shape : {"b=2 s_q=4 s_kv=8256", "b=8 s_q=3 s_kv=32768", "b=1 s_q=5 s_kv=8192",
                            "b=4 s_q=16 s_kv=8192"}) {
    EXPECT_FALSE(decode_kernel_preferred(paged(shape), Pass::forward, kH200)) << shape;
  }
  for (const char* shape : {"b=1 s_q=1 s_kv=2047", "b=4 s_q=1 s_kv=513", "b=1 s_q=1 s_kv=1"}) {
    EXPECT_FALSE(decode_kernel_preferred(contiguous(shape), Pass::forward, kH200)) << shape;  // statistics
    AttentionSpec inference = contiguous(shape);
    inference.stats = false;
    EXPECT_TRUE(decode_kernel_preferred(inference, Pass::forward, kH200)) << shape;
  }
  EXPECT_TRUE(decode_kernel_preferred(with_fp8_cache(paged("b=1 s_q=1 s_kv=8192")), Pass::forward, kH200));
  EXPECT_TRUE(decode_kernel_preferred(with_fp8_cache(contiguous("b=1 s_q=1 s_kv=64")), Pass::forward, kH200));
  EXPECT_FALSE(decode_kernel_preferred(contiguous("b=1 s_q=1 s_kv=8192"), Pass::backward, kH200));
  EXPECT_FALSE(decode_kernel_preferred(contiguous("b=1 s_q=17 s_kv=8192"), Pass::forward, kH200));
  // A sink or off-by-one over a paged cache: cuDNN's split decode cannot cut it, the kernel runs it.
  for (Softmax softmax : {Softmax::sink, Softmax::off_by_one}) {
    AttentionSpec spec = paged("b=1 s_q=1 s_kv=8192");
    spec.softmax = softmax;
    EXPECT_TRUE(decode_kernel_preferred(spec, Pass::forward, kH200)) << to_string(softmax);
  }
}

// A sink on one query row runs only on the kernel (cuDNN refuses it): where the kernel does not take
// the call, the policy says so with the kernel's reasons; several rows, or a call it takes, pass.
TEST(DecodeKernelRule, ASinkOnOneQueryRowRunsOnTheKernelOrNowhere) {
  AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=2 s_q=1 s_kv=300 h_q=8 h_kv=8 d=96 softmax=sink");
  validate(spec);
  std::vector<Reason> reasons;
  decode_extra_term_rule(spec, Pass::forward, kH200.caps, reasons);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].field, "softmax");
  EXPECT_NE(reasons[0].requirement.find("not this call: d_qk = 96 (d_v 96)"), std::string::npos)
      << reasons[0].requirement;
  EXPECT_FALSE(check_support_policy(spec, Pass::forward, kH200.caps, Versions{91900, 91900, 13200}).ok());
  reasons.clear();
  decode_extra_term_rule(spec, Pass::backward, kH200.caps, reasons);
  spec.q.dims[kSeq] = spec.o.dims[kSeq] = 2;
  decode_extra_term_rule(spec, Pass::forward, kH200.caps, reasons);
  spec.q.dims[kSeq] = spec.o.dims[kSeq] = 1;
  for (TensorDesc* t : {&spec.q, &spec.k, &spec.v, &spec.o}) t->dims[kDim] = 64;
  decode_extra_term_rule(spec, Pass::forward, kH200.caps, reasons);
  EXPECT_TRUE(reasons.empty());
}

// cuDNN's paged attention takes pages of powers of two only (cuDNN 9.19 refused 48 on an H100): other
// sizes run on the kernel whatever the pairs, and are refused where the kernel does not take them.
TEST(DecodeKernelRule, PagesOffPowersOfTwoRunOnTheKernelOrNowhere) {
  const Versions cudnn{91900, 91900, 13200};
  AttentionSpec spec = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=3 s_q=2 s_kv=960 h_q=16 h_kv=4 d=128 "
                                  "page_size=48 pages=100 causal align=bottom_right");
  validate(spec);
  EXPECT_TRUE(decode_kernel_only(spec));
  EXPECT_TRUE(decode_kernel_preferred(spec, Pass::forward, kH200));  // 12 pairs: past the paged rule's 8
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, kH200.caps, cudnn).ok());
  AttentionSpec odd = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1 s_q=1 s_kv=4000 h_q=8 h_kv=8 d=64 "
                                 "page_size=40 pages=100");
  validate(odd);
  const Support refused = check_support_policy(odd, Pass::forward, kH200.caps, cudnn);
  ASSERT_EQ(fields_of(refused.reasons), std::vector<std::string>{"page_size"});
  EXPECT_NE(refused.reasons[0].requirement.find("a power of two"), std::string::npos);
  EXPECT_NE(refused.reasons[0].requirement.find("not this call: page_size = 40"), std::string::npos)
      << refused.reasons[0].requirement;
  AttentionSpec powers = spec;
  powers.k.dims[kSeq] = powers.v.dims[kSeq] = 64;  // page_size() reads the pool's page axis
  EXPECT_EQ(powers.page_size(), 64);
  EXPECT_FALSE(decode_kernel_only(powers));
}

TEST(DecodeKernelRule, Fp8CacheReasonsSayItRunsOnlyOnTheKernel) {
  AttentionSpec spec = with_fp8_cache(paged("b=1 s_q=1 s_kv=8192"));
  spec.alibi = true;
  std::vector<Reason> reasons;
  fp8_kv_cache_rule(spec, Pass::forward, kH200.caps, reasons);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].field, "alibi");
  EXPECT_NE(reasons[0].requirement.find("an FP8 K/V cache beside bf16 queries runs only there; cuDNN takes none"),
            std::string::npos)
      << reasons[0].requirement;
  reasons.clear();
  fp8_kv_cache_rule(paged("b=1 s_q=1 s_kv=8192"), Pass::backward, kH200.caps, reasons);
  EXPECT_TRUE(reasons.empty());  // a 16-bit cache: not this rule's
  const Support support = check_support_policy(with_fp8_cache(paged("b=1 s_q=1 s_kv=8192")), Pass::backward,
                                               kH200.caps, Versions{91900, 91900, 13200});
  EXPECT_FALSE(support.ok());
}

TEST(DecodeKernelRule, Fp8CacheSpecsAreValidatedByName) {
  AttentionSpec spec = with_fp8_cache(paged("b=1 s_q=1 s_kv=8192"), Fp8Scaling::head);
  EXPECT_NO_THROW(validate(spec));
  auto field_of = [](const AttentionSpec& bad) {
    try {
      validate(bad);
    } catch (const InvalidArgument& error) {
      return error.field();
    }
    return std::string("(accepted)");
  };
  AttentionSpec mixed = spec;
  mixed.v.dtype = DType::bf16;
  EXPECT_EQ(field_of(mixed), "v.dtype");
  AttentionSpec e5m2 = spec;
  e5m2.k.dtype = e5m2.v.dtype = DType::e5m2;
  EXPECT_EQ(field_of(e5m2), "k.dtype");
  AttentionSpec sixteen = paged("b=1 s_q=1 s_kv=8192");
  sixteen.fp8_scaling = Fp8Scaling::head;
  EXPECT_EQ(field_of(sixteen), "fp8_scaling");
  // The spec string carries the cache's dtype and scaling, and parses back to the same spec.
  EXPECT_EQ(parse_spec(to_string(spec)), spec);
}

}  // namespace
}  // namespace fusedattn::detail
