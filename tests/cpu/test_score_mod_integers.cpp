// Tier 1: index arithmetic in score modifiers (floor and ceil, which //, %, and integer casts trace
// into): the text round-trips, the host evaluator computes block ids, remainders and truncation as
// Python and PyTorch do, and the steps carry no slope.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fusedattn/score_mod.h"

namespace fusedattn {
namespace {

ScoreModValue at(const char* text, double score, std::array<std::int64_t, 4> index, std::vector<float> scalars = {}) {
  ScoreModPoint p;
  p.score = score;
  p.index = index;
  p.sizes = {2, 4, 512, 512};
  p.scalars = scalars.data();
  return evaluate_with_derivative(parse_score_mod(text), p);
}

// What the adapters trace q // $0 == kv // $0 (the same block of $0 tokens), x % y and a cast to an
// integer (rounding toward zero) into.
const char* const kSameBlock = "select(eq(floor(div(q,$0)),floor(div(kv,$0))),score,-inf)";
const char* const kRemainder = "add(score,sub(sub(kv,q),mul(floor(div(sub(kv,q),$0)),$0)))";
const char* const kTruncated = "add(score,select(lt(div(score,$0),0),ceil(div(score,$0)),floor(div(score,$0))))";

TEST(ScoreModIntegers, FloorAndCeilRoundTrip) {
  for (const char* text : {kSameBlock, kRemainder, kTruncated, "ceil(score)", "floor(score)"}) {
    EXPECT_EQ(to_string(parse_score_mod(text)), text);
  }
  EXPECT_NE(parse_score_mod("floor(score)"), parse_score_mod("ceil(score)"));
}

TEST(ScoreModIntegers, BlocksRemaindersAndTruncationAsPythonComputesThem) {
  EXPECT_EQ(at(kSameBlock, 1.5, {0, 0, 70, 64}, {64.0f}).value, 1.5);  // both in block 1
  EXPECT_EQ(at(kSameBlock, 1.5, {0, 0, 70, 63}, {64.0f}).value, -INFINITY);
  // (kv - q) % 7 with Python's sign (of the divisor): -10 % 7 == 4, 10 % 7 == 3.
  EXPECT_EQ(at(kRemainder, 0.0, {0, 0, 20, 10}, {7.0f}).value, 4.0);
  EXPECT_EQ(at(kRemainder, 0.0, {0, 0, 10, 20}, {7.0f}).value, 3.0);
  // int(score / 2) toward zero: 2 for 5, -2 for -5 (floor would give -3).
  EXPECT_EQ(at(kTruncated, 5.0, {}, {2.0f}).value, 5.0 + 2.0);
  EXPECT_EQ(at(kTruncated, -5.0, {}, {2.0f}).value, -5.0 - 2.0);
}

TEST(ScoreModIntegers, StepsCarryNoSlope) {
  // d/dscore of score + trunc(score / 2) is 1: the step adds nothing between its jumps.
  EXPECT_EQ(at(kTruncated, 5.0, {}, {2.0f}).d_score, 1.0);
  EXPECT_EQ(at("floor(mul(score,3))", 0.4, {}).d_score, 0.0);
  EXPECT_EQ(at("ceil(score)", 0.4, {}).value, 1.0);
}

}  // namespace
}  // namespace fusedattn
