// The split-decode rule (src/support/decode_split.h), with worked numbers for an H200 (132 SMs):
// which paged decodes split into how many chunks, which do not, the inner calls' specs, and how a
// sequence's keys are cut.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include "fusedattn/layout.h"
#include "fusedattn/ragged.h"
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

// One round of cuDNN's tiles: 4 an SM with one query (528), 1 with several (132). One query takes a
// tile per query head (32 an entry here); several, folded, a tile of 64 rows per K/V head (8 an
// entry up to 16 queries of 4 heads each). A chunk has at least 4 pages (256 keys of 64-token pages).
TEST(DecodeSplit, WorkedNumbersOnAnH200) {
  struct Case {
    const char* shape;
    std::int64_t chunks, chunk_pages;
  };
  const Case cases[] = {
      // One query fills two rounds. b = 1: 528 / 32 = 16 chunks a round, 32 in two, at every
      // length that holds 32 of 4 pages.
      {"b=1 s_q=1 s_kv=8192", 32, 4},
      {"b=1 s_q=1 s_kv=32768", 32, 16},
      {"b=1 s_q=1 s_kv=131072", 32, 64},
      // b = 2: 528 / 64 = 8 a round, 16 in two; b = 4: 8; b = 6: 528 / 192 = 2 a round, 4; b = 8: 4.
      {"b=2 s_q=1 s_kv=8192", 16, 8},
      {"b=4 s_q=1 s_kv=8192", 8, 16},
      {"b=6 s_q=1 s_kv=8192", 4, 32},
      {"b=8 s_q=1 s_kv=8192", 4, 32},
      {"b=8 s_q=1 s_kv=32768", 4, 128},
      // 16 query tokens (speculative decoding), 64 folded rows: 8 tiles an entry, 132 / 8 = 16.
      {"b=1 s_q=16 s_kv=32768", 16, 32},
      // b = 4 with 8 queries: 32 rows, still a tile per K/V head: 132 / 32 = 4 chunks.
      {"b=4 s_q=8 s_kv=8192", 4, 32},
      // 1k tokens (16 pages) hold 4 chunks of 256 keys, fewer than the rounds' 32.
      {"b=1 s_q=1 s_kv=1024", 4, 4},
      // 576 tokens (9 pages) hold 2: of 5 pages and of 4.
      {"b=1 s_q=1 s_kv=576", 2, 5},
      // 2k tokens at b = 8 (32 pages) hold 8 chunks: the rounds' 4, of 8 pages.
      {"b=8 s_q=1 s_kv=2048", 4, 8},
  };
  for (const Case& c : cases) {
    const DecodeSplit split = decode_split(decode(c.shape), Pass::forward, kH200);
    EXPECT_EQ(split.chunks, c.chunks) << c.shape;
    EXPECT_EQ(split.chunk_pages, c.chunk_pages) << c.shape;
  }
}

TEST(DecodeSplit, NoSplitWhereItDoesNotPay) {
  // From b = 9 one round holds fewer than two chunks of each sequence (b = 16: 512 tiles fill a
  // round unsplit). 320 tokens (5 pages) and one page hold fewer than two chunks of 256 keys.
  for (const char* shape : {"b=64 s_q=1 s_kv=8192", "b=16 s_q=1 s_kv=8192", "b=9 s_q=1 s_kv=32768",
                            "b=1 s_q=1 s_kv=320", "b=1 s_q=1 s_kv=64"}) {
    EXPECT_FALSE(decode_split(decode(shape), Pass::forward, kH200).split()) << shape;
  }
  // Several queries: b = 9 with 16 (72 tiles, a round of 132 holds one chunk of each) and b = 33.
  EXPECT_FALSE(decode_split(decode("b=9 s_q=16 s_kv=8192", ""), Pass::forward, kH200).split());
  EXPECT_FALSE(decode_split(decode("b=33 s_q=16 s_kv=8192", ""), Pass::forward, kH200).split());
  // Fewer SMs hold fewer tiles: b = 8 on 32 SMs (a round of 128) does not split, b = 2 does, in
  // two rounds of two chunks.
  EXPECT_FALSE(decode_split(decode("b=8 s_q=1 s_kv=8192"), Pass::forward, 32).split());
  EXPECT_EQ(decode_split(decode("b=2 s_q=1 s_kv=8192"), Pass::forward, 32).chunks, 4);
}

// A chunk count asked for (the diagnostic's FUSEDATTN_SPLIT_DECODE=n): whole pages a chunk, so
// the count may come out lower; no split below two or where the rule could not split at all.
TEST(DecodeSplit, ACountAskedFor) {
  struct Case {
    const char* shape;
    std::int64_t asked, chunks, chunk_pages;
  };
  const Case cases[] = {
      {"b=1 s_q=1 s_kv=8192", 32, 32, 4},   // 128 pages: 32 of 4 (the rule's 16 of 8, doubled)
      {"b=8 s_q=1 s_kv=8192", 16, 16, 8},   // beyond the round the rule stops at
      {"b=1 s_q=1 s_kv=640", 4, 4, 3},      // 10 pages: 4 of 3, the last of 1
      {"b=1 s_q=1 s_kv=640", 6, 5, 2},      // 10 pages: 5 of 2
      {"b=1 s_q=1 s_kv=640", 64, 10, 1},    // never more chunks than pages
      {"b=64 s_q=1 s_kv=8192", 2, 2, 64},   // where the rule keeps one call
      {"b=1 s_q=1 s_kv=8192", 1, 1, 0},     // one chunk is no split
  };
  for (const Case& c : cases) {
    const DecodeSplit split = decode_split_in_chunks(decode(c.shape), Pass::forward, c.asked);
    EXPECT_EQ(split.chunks, c.chunks) << c.shape << " asked " << c.asked;
    EXPECT_EQ(split.chunk_pages, c.chunk_pages) << c.shape << " asked " << c.asked;
  }
  EXPECT_EQ(decode_split_in_chunks(decode("b=1 s_q=8 s_kv=8192"), Pass::forward, 4).final_pages, 2);
  EXPECT_FALSE(decode_split_in_chunks(decode("b=1 s_q=1 s_kv=8192"), Pass::backward, 4).split());
  EXPECT_FALSE(decode_split_in_chunks(decode("b=1 s_q=17 s_kv=8192"), Pass::forward, 4).split());
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
}

// Ragged queries (thd) split as dense ones of the plan's longest (bucketed from 1 over pages: a
// decode step's 1, a speculative step's 16); the masked call then takes a dense copy of them.
TEST(DecodeSplit, RaggedQueriesSplitAsDenseOnes) {
  for (const char* queries : {"s_q=1", "s_q=16"}) {
    const std::string cache = std::string(" ") + queries + " s_kv=8192 h_q=32 h_kv=8 d=128 page_size=64 pages=4096 "
                              "causal align=bottom_right";
    const AttentionSpec ragged = bucketed(parse_spec("layout=thd_paged_bshd dtype=bf16 b=1" + cache));
    const AttentionSpec dense = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1" + cache);
    const DecodeSplit split = decode_split(ragged, Pass::forward, kH200);
    EXPECT_TRUE(split.split()) << queries;
    EXPECT_EQ(split.chunks, decode_split(dense, Pass::forward, kH200).chunks) << queries;
    EXPECT_FALSE(decode_chunks_spec(ragged, split).ragged_q()) << queries;
    if (!has_masked_call(split)) continue;
    const AttentionSpec masked = decode_masked_spec(ragged, split);
    EXPECT_FALSE(masked.ragged_q());
    EXPECT_EQ(masked.q.dims, ragged.q.dims);
    EXPECT_EQ(masked.q.strides[kBatch], ragged.seq_q() * 32 * 128);  // dense bshd [b, s_q, h_q, d]
  }
  // A prefill's queries bucket past 16 and stay whole.
  EXPECT_FALSE(decode_split(bucketed(parse_spec("layout=thd_paged_bshd dtype=bf16 b=1 s_q=20 s_kv=8192 h_q=32 h_kv=8 "
                                                "d=128 page_size=64 pages=4096 causal align=bottom_right")),
                            Pass::forward, kH200)
                   .split());
}

TEST(DecodeSplit, AMaskedCallOnlyForSeveralCausalQueries) {
  EXPECT_FALSE(has_masked_call(decode_split(decode("b=1 s_q=1 s_kv=8192"), Pass::forward, kH200)));  // sees all
  EXPECT_FALSE(has_masked_call(decode_split(decode("b=1 s_q=8 s_kv=8192", ""), Pass::forward, kH200)));
  // 8 causal queries over 64-token pages: the masked keys start at a page, at most 7 + 64 of them.
  EXPECT_EQ(decode_split(decode("b=1 s_q=8 s_kv=8192"), Pass::forward, kH200).final_pages, 2);
  // Over 4-token pages: at most 7 + 4 keys, 3 pages.
  AttentionSpec small_pages = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1 s_q=8 s_kv=8192 h_q=32 h_kv=8 "
                                         "d=128 page_size=4 pages=4096 causal align=bottom_right");
  EXPECT_EQ(decode_split(small_pages, Pass::forward, kH200).final_pages, 3);
}

TEST(DecodeSplit, TheInnerCallsSpecsAndTheyDoNotSplitAgain) {
  // b = 1, 4 queries: 16 folded rows, 8 tiles an entry, 132 / 8 = 16 chunks of 8 pages.
  const AttentionSpec spec = decode("b=1 s_q=4 s_kv=8192");
  const DecodeSplit split = decode_split(spec, Pass::forward, kH200);
  ASSERT_EQ(split.chunks, 16);
  ASSERT_EQ(split.chunk_pages, 8);
  ASSERT_EQ(split.final_pages, 2);
  const AttentionSpec chunks = decode_chunks_spec(spec, split);
  EXPECT_NO_THROW(validate(chunks));
  EXPECT_EQ(chunks.batch(), 16);
  EXPECT_EQ(chunks.kv_pages, 8);
  EXPECT_FALSE(chunks.window.bounded());  // every key of a chunk is visible
  EXPECT_TRUE(chunks.stats && chunks.padding);
  // Folded: the 4 query heads of each K/V head are 4 x 4 rows of one head, dense bshd.
  EXPECT_EQ(decode_query_group(spec), 4);
  EXPECT_EQ(chunks.q.dims, (std::array<std::int64_t, 4>{16, 8, 16, 128}));
  EXPECT_EQ(chunks.q.strides, (std::array<std::int64_t, 4>{16 * 8 * 128, 128, 8 * 128, 1}));
  EXPECT_EQ(chunks.o.dims, chunks.q.dims);
  EXPECT_EQ(chunks.o.strides, chunks.q.strides);
  EXPECT_EQ(chunks.heads_q(), chunks.heads_kv());  // one query head per K/V head now
  // One query stays unfolded (cuDNN ran the folded rows slower there): [entries, 1, h_q, d].
  const AttentionSpec one = decode("b=1 s_q=1 s_kv=8192");
  const DecodeSplit one_split = decode_split(one, Pass::forward, kH200);
  EXPECT_EQ(decode_query_group(one), 1);
  EXPECT_EQ(decode_chunks_spec(one, one_split).q.dims, (std::array<std::int64_t, 4>{one_split.chunks, 32, 1, 128}));
  EXPECT_EQ(chunks.k, spec.k);  // the caller's pools
  const AttentionSpec masked = decode_masked_spec(spec, split);
  EXPECT_NO_THROW(validate(masked));
  EXPECT_EQ(masked.batch(), 1);
  EXPECT_EQ(masked.kv_pages, 2);
  EXPECT_EQ(masked.q, spec.q);  // the caller's queries
  EXPECT_EQ(masked.window, spec.window);
  EXPECT_EQ(masked.alignment, Alignment::bottom_right);
  EXPECT_EQ(masked.o.strides, (std::array<std::int64_t, 4>{4 * 32 * 128, 128, 32 * 128, 1}));
  // 16 x 8 tiles fill the round: the chunks' call does not split again, nor the masked one (2 pages,
  // all of them its own masked keys).
  EXPECT_FALSE(decode_split(chunks, Pass::forward, kH200).split());
  EXPECT_FALSE(decode_split(masked, Pass::forward, kH200).split());
  for (const char* shape : {"b=1 s_q=1 s_kv=131072", "b=1 s_q=16 s_kv=131072", "b=1 s_q=2 s_kv=32768",
                            "b=1 s_q=1 s_kv=8192", "b=8 s_q=1 s_kv=32768", "b=1 s_q=1 s_kv=576"}) {
    const AttentionSpec s = decode(shape);
    const DecodeSplit d = decode_split(s, Pass::forward, kH200);
    ASSERT_TRUE(d.split()) << shape;
    EXPECT_FALSE(decode_split(decode_chunks_spec(s, d), Pass::forward, kH200).split()) << shape;
    if (has_masked_call(d)) EXPECT_FALSE(decode_split(decode_masked_spec(s, d), Pass::forward, kH200).split()) << shape;
  }
  // 256-token pages: a chunk's minimum is one page, and the masked call's 2 pages (7 + 256 keys at
  // most) are its own masked keys, so it does not split again either.
  const AttentionSpec large_pages = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1 s_q=8 s_kv=8192 h_q=32 h_kv=8 "
                                               "d=128 page_size=256 pages=64 causal align=bottom_right");
  const DecodeSplit large = decode_split(large_pages, Pass::forward, kH200);
  ASSERT_TRUE(large.split());
  EXPECT_EQ(large.final_pages, 2);
  EXPECT_FALSE(decode_split(decode_masked_spec(large_pages, large), Pass::forward, kH200).split());
  EXPECT_FALSE(decode_split(decode_chunks_spec(large_pages, large), Pass::forward, kH200).split());
}

TEST(DecodeSplit, HowASequencesKeysAreCut) {
  // One query, or no mask: every key to the chunks (256 keys each).
  EXPECT_EQ(decode_cut(0, 1, 64, false).unmasked, 0);  // empty: nothing anywhere
  EXPECT_EQ(decode_cut(0, 1, 64, false).masked, 0);
  const DecodeCut thousand = decode_cut(1000, 1, 64, false);
  EXPECT_EQ(thousand.unmasked, 1000);
  EXPECT_EQ(thousand.masked, 0);
  EXPECT_EQ(decode_chunk_keys(thousand, 0, 256), 256);
  EXPECT_EQ(decode_chunk_keys(thousand, 3, 256), 232);  // the last one partial
  EXPECT_EQ(decode_chunk_keys(thousand, 4, 256), 0);    // past the keys: none
  // 8 causal queries, 64-token pages: the masked keys start at the page holding key len - 8.
  const DecodeCut straddle = decode_cut(1027, 8, 64, true);  // key 1019 is in page 15 (960 ..)
  EXPECT_EQ(straddle.unmasked, 960);
  EXPECT_EQ(straddle.masked, 67);  // 8 - 1 + 64 at most: here 67
  const DecodeCut aligned = decode_cut(1032, 8, 64, true);  // key 1024 starts page 16
  EXPECT_EQ(aligned.unmasked, 1024);
  EXPECT_EQ(aligned.masked, 8);
  const DecodeCut short_one = decode_cut(5, 8, 64, true);  // fewer keys than queries: all masked
  EXPECT_EQ(short_one.unmasked, 0);
  EXPECT_EQ(short_one.masked, 5);
}

}  // namespace
}  // namespace fusedattn::detail
