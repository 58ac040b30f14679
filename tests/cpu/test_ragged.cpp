// Tier 1: ragged (thd) batches — the bucketing rule with its worked numbers, plan keys that stay
// put while batches move, and the support policy for ragged inputs.
#include <gtest/gtest.h>

#include <random>
#include <algorithm>
#include <set>
#include <unordered_set>
#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/plan_cache.h"
#include "fusedattn/ragged.h"
#include "fusedattn/support.h"
#include "made_up_versions.h"

namespace fusedattn {
namespace {

AttentionSpec thd(std::int64_t batch, std::int64_t seq_q, std::int64_t seq_kv) {
  return parse_spec("layout=thd_thd_thd dtype=bf16 h_q=8 h_kv=2 d=128 causal b=" + std::to_string(batch) +
                    " s_q=" + std::to_string(seq_q) + " s_kv=" + std::to_string(seq_kv));
}

Versions cudnn(int runtime) { return made_up_versions(runtime); }

TEST(RaggedBuckets, PowersOfTwoWithASmallestSequenceBucket) {
  EXPECT_EQ(batch_bucket(1), 1);
  EXPECT_EQ(batch_bucket(3), 4);
  EXPECT_EQ(batch_bucket(64), 64);
  EXPECT_EQ(batch_bucket(65), 128);
  EXPECT_EQ(sequence_bucket(1), 64);
  EXPECT_EQ(sequence_bucket(64), 64);
  EXPECT_EQ(sequence_bucket(65), 128);
  EXPECT_EQ(sequence_bucket(4096), 4096);
  EXPECT_EQ(sequence_bucket(4097), 8192);
}

// The worked numbers of fusedattn/ragged.h: batches of 1..64 and longest sequences of 1..4096
// reach 7 buckets each.
TEST(RaggedBuckets, WorkedNumbers) {
  std::set<std::int64_t> batches, sequences;
  for (std::int64_t b = 1; b <= 64; ++b) batches.insert(batch_bucket(b));
  for (std::int64_t s = 1; s <= 4096; ++s) sequences.insert(sequence_bucket(s));
  EXPECT_EQ(batches, (std::set<std::int64_t>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(sequences, (std::set<std::int64_t>{64, 128, 256, 512, 1024, 2048, 4096}));
}

TEST(RaggedBuckets, BucketedSpecRoundsRaggedDimsOnly) {
  const AttentionSpec spec = bucketed(thd(5, 300, 1000));
  EXPECT_EQ(spec.batch(), 8);
  EXPECT_EQ(spec.seq_q(), 512);
  EXPECT_EQ(spec.seq_kv(), 1024);
  EXPECT_TRUE(spec.ragged_q());
  EXPECT_EQ(spec.q.strides, thd(5, 300, 1000).q.strides);  // token strides do not depend on sizes
  const AttentionSpec dense = parse_spec("layout=bshd b=5 s=300 h=8 d=128");
  EXPECT_EQ(bucketed(dense), dense);
}

// 1000 random packed batches (1..64 sequences, longest 1..4096 tokens) share at most 49 keys per
// pass: the plan builds such a loop can cause, whatever the data.
TEST(RaggedBuckets, RandomBatchesShareAHandfulOfPlanKeys) {
  std::mt19937_64 rng(12345);
  std::unordered_set<PlanKey, PlanKeyHash> keys;
  for (int step = 0; step < 1000; ++step) {
    const std::int64_t batch = std::uniform_int_distribution<std::int64_t>(1, 64)(rng);
    std::int64_t longest = 0;
    for (std::int64_t i = 0; i < batch; ++i) longest = std::max(longest, std::uniform_int_distribution<std::int64_t>(1, 4096)(rng));
    for (Pass pass : {Pass::forward, Pass::backward}) {
      keys.insert(make_plan_key(thd(batch, longest, longest), pass, 0, DeviceCaps{9, 0}, cudnn(91900)));
    }
  }
  EXPECT_LE(keys.size(), 2u * 49u);
  EXPECT_GE(keys.size(), 2u);
}

TEST(RaggedSpec, LayoutImpliesPaddingAndRoundTrips) {
  const AttentionSpec spec = thd(3, 100, 200);
  EXPECT_TRUE(spec.padding);
  EXPECT_EQ(to_string(spec), "layout=thd_thd_thd dtype=bf16 b=3 s_q=100 s_kv=200 h_q=8 h_kv=2 d_qk=128 d_v=128 window=-1,0");
  AttentionSpec no_padding = spec;
  no_padding.padding = false;
  EXPECT_NE(to_string(no_padding).find("padding=0"), std::string::npos);
  EXPECT_EQ(parse_spec(to_string(no_padding)), no_padding);
  EXPECT_THROW(validate(no_padding), InvalidArgument);
}

TEST(RaggedPolicy, NeedsHopperAndCudnn9_6) {
  const AttentionSpec spec = thd(4, 512, 512);
  EXPECT_TRUE(check_support_policy(spec, Pass::forward, DeviceCaps{9, 0}, cudnn(91900)).ok());
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, DeviceCaps{10, 0}, cudnn(91900)).ok());
  const Support ampere = check_support_policy(spec, Pass::forward, DeviceCaps{8, 0}, cudnn(91900));
  ASSERT_FALSE(ampere.ok());
  EXPECT_EQ(ampere.reasons[0].field, "layout");
  EXPECT_NE(ampere.to_string().find("Hopper"), std::string::npos);
  EXPECT_FALSE(check_support_policy(spec, Pass::backward, DeviceCaps{12, 0}, cudnn(91900)).ok());
  const Support old = check_support_policy(spec, Pass::forward, DeviceCaps{9, 0}, cudnn(90500));
  ASSERT_EQ(old.reasons.size(), 1u);
  EXPECT_EQ(old.reasons[0].lifted_by, "cuDNN 9.6");
}

TEST(RaggedPolicy, FeaturesNotOfferedYetSayWhich) {
  AttentionSpec spec = thd(4, 512, 512);
  spec.bias = Bias::one_hss;
  spec.dropout = 0.1;
  spec.softmax = Softmax::sink;
  const Support support = check_support_policy(spec, Pass::backward, DeviceCaps{9, 0}, cudnn(91900));
  std::set<std::string> fields;
  for (const Reason& reason : support.reasons) fields.insert(reason.field);
  EXPECT_EQ(fields, (std::set<std::string>{"bias", "dropout", "softmax"})) << support.to_string();
  EXPECT_NE(support.to_string().find("cuDNN 9.26"), std::string::npos);  // the sink's own limit
}

// Ragged Q with dense K/V is offered (its batch is not bucketed: the dense tensors hold exactly
// the call's entries); dense Q with ragged K/V is not.
TEST(RaggedPolicy, RaggedQueriesMayHaveDenseKeysButNotTheReverse) {
  AttentionSpec spec = thd(2, 128, 128);
  const AttentionSpec dense = parse_spec("layout=bshd b=2 s=128 h_q=8 h_kv=2 d=128 causal");
  spec.k = dense.k;
  spec.v = dense.v;
  EXPECT_TRUE(check_support_policy(spec, Pass::backward, DeviceCaps{9, 0}, cudnn(91900)).ok());
  EXPECT_EQ(bucketed(spec).batch(), 2);
  EXPECT_EQ(bucketed(spec).seq_q(), 128);
  spec = thd(2, 128, 128);
  spec.q = dense.q;
  spec.o = dense.o;
  const Support support = check_support_policy(spec, Pass::forward, DeviceCaps{9, 0}, cudnn(91900));
  ASSERT_EQ(support.reasons.size(), 1u) << support.to_string();
  EXPECT_EQ(support.reasons[0].value, "dense q, ragged k/v");
}

TEST(RaggedBuckets, ABatchIsBucketedOnlyWhenEveryTensorIsRagged) {
  EXPECT_EQ(bucketed(thd(5, 300, 300)).batch(), 8);
  const AttentionSpec paged = parse_spec(
      "layout=thd_paged_bshd dtype=bf16 b=5 s_q=16 s_kv=1024 h_q=8 h_kv=2 d=128 page_size=64 pages=80");
  EXPECT_EQ(bucketed(paged).batch(), 5);
  EXPECT_EQ(bucketed(paged).seq_q(), 16);    // over pages, query buckets start at 1
  EXPECT_EQ(bucketed(paged).k.batch(), 80);  // the pool keeps its pages
}

// Over a paged cache, ragged queries' buckets start at 1: a decode step keeps its own few queries.
TEST(RaggedBuckets, QueriesOverPagesStartAtOne) {
  const std::string cache = " s_kv=1024 h_q=8 h_kv=2 d=128 page_size=64 pages=80";
  for (auto [queries, bucket] : {std::pair{1, 1}, {3, 4}, {16, 16}, {17, 32}, {100, 128}}) {
    const AttentionSpec spec =
        parse_spec("layout=thd_paged_bshd dtype=bf16 b=5 s_q=" + std::to_string(queries) + cache);
    EXPECT_EQ(bucketed(spec).seq_q(), bucket) << queries;
    EXPECT_EQ(bucketed(spec).o.seq(), bucket) << queries;
  }
  const std::vector<AttentionSpec> specs =
      ragged_buckets(parse_spec("layout=thd_paged_bshd dtype=bf16 b=5 s_q=16" + cache));
  ASSERT_EQ(specs.size(), 5u);  // 1, 2, 4, 8, 16
  EXPECT_EQ(specs.front().seq_q(), 1);
  for (const AttentionSpec& spec : specs) EXPECT_EQ(bucketed(spec), spec) << to_string(spec);
}

// What a warm-up of a ragged training configuration builds (fusedattn/ragged.h ragged_buckets):
// worked numbers, as in the header's comment.
TEST(RaggedBuckets, SelfAttentionBucketsPairQueriesWithKeys) {
  const std::vector<AttentionSpec> specs = ragged_buckets(thd(64, 4096, 4096));
  ASSERT_EQ(specs.size(), 7u * 7u);  // batches 1..64, sequences 64..4096, Q and K/V together
  EXPECT_EQ(specs.front().batch(), 1);
  EXPECT_EQ(specs.front().seq_q(), 64);
  EXPECT_EQ(specs.back().batch(), 64);
  EXPECT_EQ(specs.back().seq_kv(), 4096);
  for (const AttentionSpec& spec : specs) {
    EXPECT_EQ(spec.seq_q(), spec.seq_kv());
    EXPECT_EQ(bucketed(spec), spec) << "a warm-up spec must be a plan's own (bucketed) spec";
    EXPECT_NO_THROW(validate(spec)) << to_string(spec);
  }
}

TEST(RaggedBuckets, IndependentLengthsTakeEveryPair) {
  // Batches {1, 2} x Q buckets {64, 128} x K/V buckets {64, 128, 256}.
  const std::vector<AttentionSpec> specs = ragged_buckets(thd(2, 100, 200));
  EXPECT_EQ(specs.size(), 2u * 2u * 3u);
}

TEST(RaggedBuckets, OnlyWhatBucketingMovesIsVaried) {
  const AttentionSpec paged = parse_spec(
      "layout=thd_paged_bshd dtype=bf16 b=5 s_q=300 s_kv=1024 h_q=8 h_kv=2 d=128 page_size=64 pages=80");
  const std::vector<AttentionSpec> specs = ragged_buckets(paged);
  ASSERT_EQ(specs.size(), 10u);  // Q buckets 1 .. 512 (over pages from 1); the batch stays 5, the cache as it is
  for (const AttentionSpec& spec : specs) {
    EXPECT_EQ(spec.batch(), 5);
    EXPECT_EQ(spec.k, paged.k);
  }
  const AttentionSpec dense = parse_spec("layout=bshd b=3 s=1000 h=8 d=64");
  ASSERT_EQ(ragged_buckets(dense).size(), 1u);
  EXPECT_EQ(ragged_buckets(dense)[0], dense);
}

}  // namespace
}  // namespace fusedattn
