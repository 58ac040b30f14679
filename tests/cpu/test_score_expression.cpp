// Tier 1: traced score expressions (fusedattn/score_expression.h): the root sum's terms that gather
// come apart from the rest, signs kept, in order, and the adapters' refusals have what they name.
#include <gtest/gtest.h>

#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/score_expression.h"
#include "fusedattn/score_mod.h"

namespace fusedattn {
namespace {

GatheredTerms split(const std::string& text) { return split_gathered_terms(parse_score_expression(text)); }

TEST(ScoreExpression, WithoutAGatherTheExpressionStaysWhole) {
  // neg(sub(..)) is not flattened: only an expression with gathered terms is taken apart.
  for (const char* text : {"mul($0,tanh(div(score,$0)))", "neg(sub(score,t0[h]))", "score"}) {
    const GatheredTerms terms = split(text);
    EXPECT_EQ(terms.rest, text);
    EXPECT_EQ(terms.gathered, "");
    EXPECT_EQ(terms.gathered_with_score, "");
  }
  EXPECT_EQ(split("").rest, "");
}

TEST(ScoreExpression, GatheredTermsComeApartWithTheirSigns) {
  // 2 tanh(s / 2) + table[h, clamp(kv - q) + 8] - slopes[h] |q - kv|, slopes learned (a gather).
  const GatheredTerms terms =
      split("sub(add(mul($0,tanh(div(score,$0))),G1(h,add(min(max(sub(kv,q),-8),8),8))),mul(G2(h),abs(sub(q,kv))))");
  EXPECT_EQ(terms.rest, "mul($0,tanh(div(score,$0)))");
  EXPECT_EQ(terms.gathered, "sub(G1(h,add(min(max(sub(kv,q),-8),8),8)),mul(G2(h),abs(sub(q,kv))))");
  EXPECT_EQ(terms.gathered_with_score, "");
  // A first term of sign -, and rest terms added and subtracted in their order.
  const GatheredTerms negated = split("sub(sub(score,G0(h)),neg(add(t1[h],$0)))");
  EXPECT_EQ(negated.rest, "add(add(score,t1[h]),$0)");
  EXPECT_EQ(negated.gathered, "neg(G0(h))");
  // The plain score left over stays "score" (the adapters then pass no modifier).
  EXPECT_EQ(split("add(score,G0(h,kv))").rest, "score");
}

TEST(ScoreExpression, WhatTheAdaptersRefuseIsNamed) {
  // A gathering term that reads the score (it multiplies the score) cannot be a bias: named.
  const GatheredTerms mixed = split("add(mul(score,G0(h)),G1(kv))");
  EXPECT_EQ(mixed.gathered_with_score, "mul(score,G0(h))");
  EXPECT_EQ(mixed.rest, "");
  // Nothing but gathered terms: no rest.
  const GatheredTerms only = split("add(G0(h),G1(kv))");
  EXPECT_EQ(only.rest, "");
  EXPECT_EQ(only.gathered, "add(G0(h),G1(kv))");
  EXPECT_EQ(only.gathered_with_score, "");
}

TEST(ScoreExpression, ItsRestParsesAsAModifier) {
  const GatheredTerms terms = split("add(select(le(kv,q),score,-inf),G0(h,kv))");
  EXPECT_EQ(to_string(parse_score_mod(terms.rest)), "select(le(kv,q),score,-inf)");
  EXPECT_THROW(parse_score_mod(terms.gathered), InvalidArgument);
}

}  // namespace
}  // namespace fusedattn
