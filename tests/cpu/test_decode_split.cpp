// The split-decode rule (src/support/decode_split.h), with worked numbers for an H200 (132 SMs):
// which paged decodes split into how many chunks, which do not, the inner calls' specs, and how a
// sequence's keys are cut.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include "fusedattn/spec.h"
#include "support/decode_split.h"

namespace fusedattn::detail {
namespace {

constexpr int kH200 = 132;

AttentionSpec decode(const std::string& shape, const std::string& extra = " causal align=bottom_right") {
  AttentionSpec spec =
      parse_spec("layout=bshd_paged_bshd dtype=bf16 h_q=32 h_kv=8 d=128 page_size=64 pages=4096 " + shape + extra);
  validate(spec);
  return spec;
}

// 264 (sequence, K/V head) pairs wanted: 2 per SM.
TEST(DecodeSplit, WorkedNumbersOnAnH200) {
  struct Case {
    const char* shape;
    std::int64_t chunks, chunk_pages;
  };
  const Case cases[] = {
      // b = 1, h_kv = 8: 8 pairs, 33 chunks wanted; 8k tokens (128 pages) allow 32 of 256 keys.
      {"b=1 s_q=1 s_kv=8192", 32, 4},
      // 32k: 33 chunks of ceil(512 / 33) = 16 pages give ceil(512 / 16) = 32 chunks.
      {"b=1 s_q=1 s_kv=32768", 32, 16},
      // 128k: ceil(2048 / 33) = 63 pages a chunk, 33 chunks.
      {"b=1 s_q=1 s_kv=131072", 33, 63},
      // b = 8: 64 pairs, ceil(264 / 64) = 5 chunks of ceil(128 / 5) = 26 pages.
      {"b=8 s_q=1 s_kv=8192", 5, 26},
      // b = 4 with 8 query tokens (speculative decoding): 32 pairs, 9 chunks of 15 pages.
      {"b=4 s_q=8 s_kv=8192", 9, 15},
      // 1k tokens: at most 4 chunks of 256 keys.
      {"b=1 s_q=1 s_kv=1024", 4, 4},
  };
  for (const Case& c : cases) {
    const DecodeSplit split = decode_split(decode(c.shape), Pass::forward, kH200);
    EXPECT_EQ(split.chunks, c.chunks) << c.shape;
    EXPECT_EQ(split.chunk_pages, c.chunk_pages) << c.shape;
  }
}

TEST(DecodeSplit, NoSplitWhereItDoesNotPay) {
  // b = 64: 512 pairs already fill the GPU. 300 tokens: one chunk of 256 keys at most (5 pages
  // make one 4-page chunk). One page: nothing to cut.
  for (const char* shape : {"b=64 s_q=1 s_kv=8192", "b=33 s_q=1 s_kv=8192", "b=1 s_q=1 s_kv=320",
                            "b=1 s_q=1 s_kv=64"}) {
    EXPECT_FALSE(decode_split(decode(shape), Pass::forward, kH200).split()) << shape;
  }
  // Fewer SMs want fewer pairs: b = 8 on 32 SMs (64 pairs wanted) is already there.
  EXPECT_FALSE(decode_split(decode("b=8 s_q=1 s_kv=8192"), Pass::forward, 32).split());
}

TEST(DecodeSplit, OnlyWhatMergesByLogSumExp) {
  EXPECT_TRUE(decode_split(decode("b=1 s_q=1 s_kv=8192", ""), Pass::forward, kH200).split());  // no mask
  const char* refused[] = {
      " causal",                                   // top-left: a chunk's mask would move
      " window=128,0 align=bottom_right",          // a left bound
      " causal align=bottom_right softmax=off_by_one",  // every chunk would add its e^0
      " causal align=bottom_right bias=11ss",
      " causal align=bottom_right max_logit=row",
      " causal align=bottom_right score_mod=mul(tanh(div(score,$0)),$0)",
  };
  for (const char* extra : refused) {
    AttentionSpec spec = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1 s_q=1 s_kv=8192 h_q=32 h_kv=8 d=128 "
                                    "page_size=64 pages=4096" + std::string(extra));
    EXPECT_FALSE(decode_split(spec, Pass::forward, kH200).split()) << extra;
  }
  EXPECT_FALSE(decode_split(decode("b=1 s_q=17 s_kv=8192"), Pass::forward, kH200).split());  // past 16 queries
  // Several causal queries need a page of s_q - 1 tokens: 8 queries over 4-token pages do not split.
  AttentionSpec small_pages = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1 s_q=8 s_kv=8192 h_q=32 h_kv=8 "
                                         "d=128 page_size=4 pages=4096 causal align=bottom_right");
  EXPECT_FALSE(decode_split(small_pages, Pass::forward, kH200).split());
  // Ragged queries (thd) are not split yet.
  AttentionSpec ragged = parse_spec("layout=thd_paged_bshd dtype=bf16 b=1 s_q=1 s_kv=8192 h_q=32 h_kv=8 d=128 "
                                    "page_size=64 pages=4096 causal align=bottom_right");
  EXPECT_FALSE(decode_split(ragged, Pass::forward, kH200).split());
}

TEST(DecodeSplit, TheInnerCallsSpecs) {
  // b = 2: 16 pairs, 17 chunks wanted, of ceil(128 / 17) = 8 pages: ceil(128 / 8) = 16 chunks.
  const AttentionSpec spec = decode("b=2 s_q=4 s_kv=8192");
  const DecodeSplit split = decode_split(spec, Pass::forward, kH200);
  ASSERT_EQ(split.chunks, 16);
  ASSERT_EQ(split.chunk_pages, 8);
  const AttentionSpec full = decode_full_chunks_spec(spec, split);
  EXPECT_NO_THROW(validate(full));
  EXPECT_EQ(full.batch(), 2 * 15);  // every sequence's 15 full chunks
  EXPECT_EQ(full.kv_pages, 8);
  EXPECT_FALSE(full.window.bounded());  // every key of a full chunk is visible
  EXPECT_TRUE(full.stats && full.padding);
  EXPECT_EQ(full.q.strides, (std::array<std::int64_t, 4>{4 * 32 * 128, 128, 32 * 128, 1}));  // dense bshd
  EXPECT_EQ(full.k, spec.k);  // the caller's pools
  const AttentionSpec final_chunk = decode_final_chunk_spec(spec, split);
  EXPECT_NO_THROW(validate(final_chunk));
  EXPECT_EQ(final_chunk.batch(), 2);
  EXPECT_EQ(final_chunk.kv_pages, 9);  // one page more: a final chunk up to s_q - 1 keys longer
  EXPECT_EQ(final_chunk.q, spec.q);    // the caller's queries
  EXPECT_EQ(final_chunk.window, spec.window);
  EXPECT_EQ(final_chunk.alignment, Alignment::bottom_right);
  EXPECT_EQ(final_chunk.o.strides, (std::array<std::int64_t, 4>{4 * 32 * 128, 128, 32 * 128, 1}));
}

TEST(DecodeSplit, HowASequencesKeysAreCut) {
  // Chunks of 256 keys.
  EXPECT_EQ(decode_chunks(0, 1, 256, false).full, 0);          // empty: nothing
  EXPECT_EQ(decode_chunks(0, 1, 256, false).final_keys, 0);
  EXPECT_EQ(decode_chunks(1, 1, 256, false).final_keys, 1);    // one key: the final chunk alone
  EXPECT_EQ(decode_chunks(256, 1, 256, false).full, 0);        // exactly one chunk: final
  EXPECT_EQ(decode_chunks(256, 1, 256, false).final_keys, 256);
  EXPECT_EQ(decode_chunks(257, 1, 256, false).full, 1);        // one more key: a full chunk and 1
  EXPECT_EQ(decode_chunks(257, 1, 256, false).final_keys, 1);
  EXPECT_EQ(decode_chunks(1000, 1, 256, false).full, 3);       // 3 full, 232 final
  EXPECT_EQ(decode_chunks(1000, 1, 256, false).final_keys, 232);
  // 8 causal queries: the final chunk must hold the last 8 keys. 1027 keys: 4 full chunks would
  // leave 3, so 3 full and 259 final (one page more than a chunk's 256 at most).
  EXPECT_EQ(decode_chunks(1027, 8, 256, true).full, 3);
  EXPECT_EQ(decode_chunks(1027, 8, 256, true).final_keys, 259);
  EXPECT_EQ(decode_chunks(1032, 8, 256, true).full, 4);        // 8 left: enough
  EXPECT_EQ(decode_chunks(1032, 8, 256, true).final_keys, 8);
  EXPECT_EQ(decode_chunks(5, 8, 256, true).full, 0);           // fewer keys than queries: all final
  EXPECT_EQ(decode_chunks(5, 8, 256, true).final_keys, 5);
}

}  // namespace
}  // namespace fusedattn::detail
