// Tier 1: score modifiers (fusedattn/score_mod.h): the text form round-trips, equality is by
// structure, every malformed text is refused naming where and what (a gather too, which only a
// traced expression may hold), and the host evaluator computes the named modifiers of
// FlexAttention's users.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/score_expression.h"
#include "fusedattn/score_mod.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"
#include "made_up_versions.h"

namespace fusedattn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The named modifiers, in their canonical text.
const char* const kSoftcap = "mul(tanh(div(score,$0)),$0)";               // cap * tanh(score / cap)
const char* const kAlibi = "add(score,mul(t0[h],sub(kv,q)))";             // slope[h] * (kv - q)
const char* const kPrefixLm = "select(or(le(kv,q),lt(kv,$0)),score,-inf)";  // causal past a prefix of $0
const char* const kSlidingWindow = "select(and(le(kv,q),gt(kv,sub(q,$0))),score,-inf)";  // the last $0 keys
const char* const kPerQueryKey = "add(score,t0[q,kv])";                   // a bias over (q, kv)

TEST(ScoreMod, NamedModifiersRoundTrip) {
  for (const char* text : {kSoftcap, kAlibi, kPrefixLm, kSlidingWindow, kPerQueryKey, "score",
                           "select(ne(b,1),exp(score),sigmoid(abs(score)))", "pow(max(min(score,2.5),-1e-07),0.5)",
                           "min(score,inf)"}) {
    const ScoreMod mod = parse_score_mod(text);
    EXPECT_EQ(to_string(mod), text);
    EXPECT_EQ(parse_score_mod(to_string(mod)), mod) << text;
    EXPECT_EQ(hash_value(parse_score_mod(text)), hash_value(mod)) << text;
  }
  EXPECT_TRUE(parse_score_mod("").empty());
  EXPECT_EQ(to_string(ScoreMod{}), "");
}

TEST(ScoreMod, EqualExactlyWhenTheTreesAre) {
  EXPECT_EQ(parse_score_mod("mul(score,2)"), parse_score_mod("mul(score,2.0)"));  // the same value
  EXPECT_EQ(to_string(parse_score_mod("mul(score,2.000)")), "mul(score,2)");
  EXPECT_NE(parse_score_mod("mul(score,2)"), parse_score_mod("mul(score,3)"));  // a constant is structure
  EXPECT_NE(parse_score_mod("mul(score,2)"), parse_score_mod("mul(2,score)"));
  EXPECT_NE(parse_score_mod("mul(score,$0)"), parse_score_mod("div(score,$0)"));
  EXPECT_NE(parse_score_mod("add(score,0)"), parse_score_mod("add(score,-0)"));  // they print apart
  EXPECT_NE(parse_score_mod("add(score,t0[h])"), parse_score_mod("add(score,t0[q])"));
  EXPECT_NE(parse_score_mod("score"), ScoreMod{});
  EXPECT_EQ(parse_score_mod("min(score,+inf)"), parse_score_mod("min(score,inf)"));
}

TEST(ScoreMod, CountsItsScalarsAndTensors) {
  const ScoreMod softcap = parse_score_mod(kSoftcap);
  EXPECT_EQ(softcap.scalars(), 1);
  EXPECT_EQ(softcap.tensors(), 0);
  const ScoreMod both = parse_score_mod("add(mul(t1[b,kv],$1),mul(t0[h],$0))");
  EXPECT_EQ(both.scalars(), 2);
  ASSERT_EQ(both.tensors(), 2);
  EXPECT_EQ(both.tensor_axes(0), kAxisH);
  EXPECT_EQ(both.tensor_axes(1), kAxisB | kAxisKv);
  EXPECT_EQ(both.nodes().back().op, ScoreOp::add);  // post-order: the root last
}

struct Refusal {
  const char* text;
  const char* wanted;  // in the requirement
};

TEST(ScoreMod, MalformedTextIsRefusedNamingWhereAndWhat) {
  for (const Refusal& r : std::vector<Refusal>{
           {"tanh", "'('"},                            // an operation without arguments
           {"mul(score)", "','"},                      // too few
           {"tanh(score,1)", "tanh takes 1"},          // too many
           {"mul(score,2", "')'"},                     // unclosed
           {"score)", "the end of the expression"},    // trailing text
           {"mul(score, 2)", "an operation"},          // no spaces
           {"softcap(score)", "an operation"},         // unknown
           {"mul(score,nan)", "an operation"},         // nan reads as a name, and is none
           {"mul(score,-nan)", "nan is not"},
           {"mul(score,$)", "a slot number"},
           {"mul(score,$1)", "$0 is missing"},         // slots without gaps
           {"add(t1[h],score)", "t0 is missing"},
           {"add(t0[h],t0[q])", "one set of axes for t0"},
           {"add(t0[q,h],score)", "in that order"},
           {"add(t0[],score)", "one of the axes"},
       }) {
    try {
      parse_score_mod(r.text);
      ADD_FAILURE() << r.text << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.field(), "score_mod") << r.text;
      EXPECT_NE(e.requirement().find(r.wanted), std::string::npos) << r.text << ": " << e.what();
      EXPECT_NE(e.value().find(r.text), std::string::npos) << r.text;
    }
  }
  std::string deep = "score";
  for (int i = 0; i < 300; ++i) deep = "neg(" + deep + ")";
  EXPECT_THROW(parse_score_mod(deep), InvalidArgument);  // at most 256 nodes
}

// A relative-position table by clamped distance, as the adapters trace table[h, clamp(kv - q) + 8].
const char* const kRelativePosition = "G0(h,add(min(max(sub(kv,q),-8),8),8))";

TEST(ScoreMod, GathersRoundTripInExpressions) {
  for (const char* text : {kRelativePosition, "G1(b,h,q,kv)", "add(mul($0,tanh(div(score,$0))),G2(sub(kv,q)))",
                           "add(score,mul(t0[h],G1(kv)))"}) {
    const ScoreExpression expression = parse_score_expression(text);
    EXPECT_EQ(to_string(expression), text);
    EXPECT_EQ(to_string(parse_score_expression(to_string(expression))), text);
  }
  const ScoreExpression table = parse_score_expression(kRelativePosition);
  const ScoreModNode& root = table.nodes().back();
  EXPECT_EQ(root.op, ScoreOp::gather);
  EXPECT_EQ(root.slot, 0);
  EXPECT_EQ(table.nodes()[static_cast<std::size_t>(root.args[0])].op, ScoreOp::head);
  EXPECT_EQ(root.args[2], -1);  // two indices
  EXPECT_EQ(to_string(ScoreOp::gather), "gather");
  EXPECT_EQ(to_string(ScoreOp::logical_not), "not");
  EXPECT_EQ(to_string(ScoreOp::kv_index), "kv");
  // An expression's slots are as the tracer wrote them: gaps and more than a modifier takes.
  EXPECT_NO_THROW(parse_score_expression("add(t5[h],$9)"));
  EXPECT_TRUE(parse_score_expression("").empty());
}

TEST(ScoreMod, AGatherIsRefusedWhereCudnnWouldRunIt) {
  // cuDNN's score graph has no gather: a modifier, and so a spec and a call's config, refuse one,
  // saying where the term runs instead.
  for (const char* text : {kRelativePosition, "add(score,G0(h,kv))"}) {
    try {
      parse_score_mod(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.field(), "score_mod");
      EXPECT_NE(e.value().find(text), std::string::npos) << e.what();
      EXPECT_NE(e.requirement().find("cuDNN's score graph cannot gather"), std::string::npos) << e.what();
      EXPECT_NE(e.requirement().find("runs as the call's bias"), std::string::npos) << e.what();
    }
  }
  try {
    parse_spec("layout=bshd b=1 s=64 h=2 d=64 score_mod=add(score,G0(h,kv))");
    ADD_FAILURE() << "a spec with a gather was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "score_mod");
    EXPECT_NE(e.requirement().find("cannot gather"), std::string::npos) << e.what();
  }
}

TEST(ScoreMod, MalformedGathersAreRefusedNamingWhereAndWhat) {
  for (const Refusal& r : std::vector<Refusal>{
           {"G0()", "an operation"},  // an index wanted
           {"G0(h", "')'"},
           {"G0(b,h,q,kv,b)", "at most 4 indices"},
           {"G(h)", "an operation"},
       }) {
    try {
      parse_score_expression(r.text);
      ADD_FAILURE() << r.text << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.field(), "score_mod") << r.text;
      EXPECT_NE(e.requirement().find(r.wanted), std::string::npos) << r.text << ": " << e.what();
    }
  }
}

double at(const char* text, double score, std::array<std::int64_t, 4> index, std::vector<float> scalars = {},
          std::vector<const float*> tensors = {}) {
  ScoreModPoint p;
  p.score = score;
  p.index = index;
  p.sizes = {2, 4, 8, 16};  // b, h_q, s_q, s_kv
  p.scalars = scalars.data();
  p.tensors = tensors.data();
  return evaluate(parse_score_mod(text), p);
}

TEST(ScoreMod, EvaluatesTheNamedModifiers) {
  EXPECT_DOUBLE_EQ(at(kSoftcap, 10.0, {0, 0, 0, 0}, {5.0f}), 5.0 * std::tanh(2.0));
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  EXPECT_DOUBLE_EQ(at(kAlibi, 1.0, {1, 2, 7, 3}, {}, {slopes.data()}), 1.0 + 0.125 * (3 - 7));
  EXPECT_EQ(at(kPrefixLm, 1.5, {0, 0, 2, 5}, {4.0f}), -kInf);  // past q and past the prefix
  EXPECT_EQ(at(kPrefixLm, 1.5, {0, 0, 2, 3}, {4.0f}), 1.5);    // inside the prefix
  EXPECT_EQ(at(kPrefixLm, 1.5, {0, 0, 6, 5}, {4.0f}), 1.5);    // causal
  EXPECT_EQ(at(kSlidingWindow, 1.5, {0, 0, 6, 4}, {3.0f}), 1.5);  // keys 4, 5, 6 for query 6
  EXPECT_EQ(at(kSlidingWindow, 1.5, {0, 0, 6, 3}, {3.0f}), -kInf);
  EXPECT_EQ(at(kSlidingWindow, 1.5, {0, 0, 6, 7}, {3.0f}), -kInf);
  EXPECT_DOUBLE_EQ(at("sigmoid(score)", 0.0, {}), 0.5);
  EXPECT_EQ(at("select(ne(b,1),7,8)", 0.0, {1, 0, 0, 0}), 8.0);
  EXPECT_EQ(at("not(h)", 0.0, {0, 0, 0, 0}), 1.0);
}

TEST(ScoreMod, TensorsAreContiguousOverTheirAxesInOrder) {
  std::vector<float> bias(8 * 16);  // [s_q, s_kv]
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i);
  EXPECT_EQ(at(kPerQueryKey, 0.0, {1, 3, 2, 5}, {}, {bias.data()}), 2 * 16 + 5);
  std::vector<float> per_batch_key(2 * 16);  // [b, s_kv]
  for (std::size_t i = 0; i < per_batch_key.size(); ++i) per_batch_key[i] = static_cast<float>(i);
  EXPECT_EQ(at("t0[b,kv]", 0.0, {1, 3, 2, 5}, {}, {per_batch_key.data()}), 16 + 5);
}

TEST(ScoreMod, TheEmptyModifierLeavesTheScore) {
  ScoreModPoint p;
  p.score = 3.25;
  EXPECT_EQ(evaluate(ScoreMod{}, p), 3.25);
  EXPECT_EQ(evaluate_with_derivative(ScoreMod{}, p).d_score, 1.0);
}

TEST(ScoreMod, DerivativesMatchCentralDifferences) {
  const std::vector<float> scalars = {0.75f};
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  const std::vector<const float*> tensors = {slopes.data()};
  for (const char* text : {kSoftcap, kAlibi, kPrefixLm, "mul(exp(neg(score)),sigmoid(score))",
                           "div(log(add(abs(score),2)),sqrt(add(mul(score,score),1)))", "pow(add(score,3),1.5)",
                           "pow(2,score)", "pow(add(score,3),score)", "select(gt(score,0),mul(score,score),neg(score))",
                           "max(score,mul(score,0.5))", "min(tanh(score),$0)", "mul(sub(score,t0[h]),$0)"}) {
    const ScoreMod mod = parse_score_mod(text);
    for (double score : {-1.3, -0.2, 0.35, 1.7}) {
      ScoreModPoint p;
      p.index = {1, 2, 6, 3};
      p.sizes = {2, 4, 8, 16};
      p.scalars = scalars.data();
      p.tensors = tensors.data();
      p.score = score;
      const ScoreModValue got = evaluate_with_derivative(mod, p);
      EXPECT_EQ(got.value, evaluate(mod, p));
      const double h = 1e-6;
      p.score = score + h;
      const double up = evaluate(mod, p);
      p.score = score - h;
      const double down = evaluate(mod, p);
      if (!std::isfinite(up) || !std::isfinite(down)) {  // a masked score: no gradient flows there
        EXPECT_EQ(got.d_score, 0.0) << text << " at " << score;
        continue;
      }
      EXPECT_NEAR(got.d_score, (up - down) / (2 * h), 1e-6 * std::max(1.0, std::fabs(got.d_score)))
          << text << " at " << score;
    }
  }
}

TEST(ScoreMod, ATermThatIgnoresTheScoreAddsNoSlopeWhereItsOwnDerivativeIsInfinite) {
  // sqrt(|kv - q|) is 0 on the diagonal, where sqrt's derivative is not finite; the term does not
  // move with the score, so the slope there is exactly 1 (a reference that multiplied 0 by inf
  // made the GPU test's dQ and dK NaN on the H200).
  const ScoreMod mod = parse_score_mod("sub(score,sqrt(abs(sub(kv,q))))");
  ScoreModPoint p;
  p.index = {0, 1, 5, 5};
  p.sizes = {1, 2, 8, 8};
  p.score = 0.4;
  const ScoreModValue got = evaluate_with_derivative(mod, p);
  EXPECT_EQ(got.value, 0.4);
  EXPECT_EQ(got.d_score, 1.0);
}

// --- in the spec -----------------------------------------------------------------------------------

AttentionSpec softcapped() {
  AttentionSpec spec = parse_spec("layout=bshd b=2 s=512 h=8 d=128 causal");
  spec.score_mod = parse_score_mod(kSoftcap);
  return spec;
}

TEST(ScoreModSpec, PrintsParsesComparesAndHashesInTheSpec) {
  const AttentionSpec spec = softcapped();
  const std::string text = to_string(spec);
  EXPECT_NE(text.find(std::string("score_mod=") + kSoftcap), std::string::npos) << text;
  EXPECT_EQ(parse_spec(text), spec);
  EXPECT_EQ(hash_value(parse_spec(text)), hash_value(spec));
  AttentionSpec other = spec;
  other.score_mod = parse_score_mod("mul(tanh(div(score,$0)),$1)");
  EXPECT_NE(other, spec);  // another structure, another plan
  AttentionSpec plain = spec;
  plain.score_mod = ScoreMod{};
  EXPECT_NE(plain, spec);
  EXPECT_EQ(to_string(plain).find("score_mod"), std::string::npos);  // the default is not printed
  EXPECT_NO_THROW(validate(spec));
}

TEST(ScoreModSpec, ABadExpressionInTheSpecNamesTheField) {
  try {
    parse_spec("layout=bshd b=1 s=64 h=2 d=64 score_mod=mul(score)");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "score_mod");
  }
}

TEST(ScoreModSpec, ThePolicyTakesItWithMasksPaddingAndGroupedHeads) {
  AttentionSpec grouped = parse_spec("layout=bshd b=2 s_q=300 s_kv=500 h_q=8 h_kv=2 d=128 window=64,0 "
                                     "align=bottom_right padding=1");
  grouped.score_mod = parse_score_mod(kSoftcap);
  for (Pass pass : {Pass::forward, Pass::backward}) {
    for (const AttentionSpec& spec : {softcapped(), grouped}) {
      const Support support = check_support_policy(spec, pass, DeviceCaps{9, 0}, made_up_versions(91900));
      EXPECT_TRUE(support.ok()) << to_string(spec) << ": " << support.to_string();
    }
  }
}

TEST(ScoreModSpec, ThePolicyNamesWhatAModifierExcludes) {
  // Too old a cuDNN and FP8 inputs: two reasons at once.
  AttentionSpec fp8 = parse_spec("layout=bshd dtype=e4m3 b=1 s=256 h=4 d=128 causal");
  fp8.score_mod = parse_score_mod(kSoftcap);
  const Support old_fp8 = check_support_policy(fp8, Pass::forward, DeviceCaps{9, 0}, made_up_versions(90500));
  std::string fields;
  for (const Reason& reason : old_fp8.reasons) {
    if (reason.field == "score_mod") fields += reason.requirement.substr(0, 9) + "(" + reason.lifted_by + ");";
  }
  EXPECT_EQ(fields, "cuDNN 9.6(cuDNN 9.6);f16 or bf();") << old_fp8.to_string();
  // ALiBi beside a modifier: refused with the way to write it in.
  AttentionSpec alibi = parse_spec("layout=bshd b=1 s=256 h=4 d=128 causal alibi=1");
  alibi.score_mod = parse_score_mod(kSoftcap);
  const Support refused = check_support_policy(alibi, Pass::backward, DeviceCaps{9, 0}, made_up_versions(91900));
  ASSERT_EQ(refused.reasons.size(), 1u) << refused.to_string();
  EXPECT_EQ(refused.reasons[0].field, "alibi");
  EXPECT_NE(refused.reasons[0].requirement.find("add(score,mul(t0[h],sub(kv,q)))"), std::string::npos);
}

TEST(ScoreModSpec, ABiasGradientBesideAModifierIsRefusedInTheBackwardOnly) {
  // cuDNN 9.19's dBias beside a modifier was wrong on the H200: the backward is refused, naming
  // bias_grad; the forward, and the backward of a bias without a gradient, are not.
  AttentionSpec learned = parse_spec("layout=bshd b=2 s_q=256 s_kv=320 h_q=8 h_kv=2 d=64 bias=1hss bias_grad=1");
  learned.score_mod = parse_score_mod("mul(2.0,tanh(div(score,2.0)))");
  const Support backward = check_support_policy(learned, Pass::backward, DeviceCaps{9, 0}, made_up_versions(91900));
  ASSERT_EQ(backward.reasons.size(), 1u) << backward.to_string();
  EXPECT_EQ(backward.reasons[0].field, "bias_grad");
  EXPECT_NE(backward.reasons[0].requirement.find("wrong dBias"), std::string::npos);
  EXPECT_TRUE(check_support_policy(learned, Pass::forward, DeviceCaps{9, 0}, made_up_versions(91900)).ok());
  AttentionSpec fixed = learned;
  fixed.bias_grad = false;
  EXPECT_TRUE(check_support_policy(fixed, Pass::backward, DeviceCaps{9, 0}, made_up_versions(91900)).ok());
  AttentionSpec plain = learned;  // a learned bias without a modifier keeps its gradient
  plain.score_mod = ScoreMod{};
  EXPECT_TRUE(check_support_policy(plain, Pass::backward, DeviceCaps{9, 0}, made_up_versions(91900)).ok());
}

TEST(ScoreMod, ShiftedIndicesReadTheWholeProblemsPositions) {
  const ScoreMod mod = parse_score_mod("add(score,mul(t0[h],sub(kv,q)))");
  const ScoreMod shifted = shift_indices(mod, 3072, 16);
  EXPECT_EQ(to_string(shifted), "add(score,mul(t0[h],sub(add(kv,16),add(q,3072))))");
  const float slopes[2] = {0.5f, 0.25f};
  const float* tensors[1] = {slopes};
  ScoreModPoint local;
  local.score = 1.0;
  local.index = {0, 1, 5, 7};
  local.sizes = {1, 2, 100, 100};
  local.tensors = tensors;
  ScoreModPoint whole = local;
  whole.index = {0, 1, 3077, 23};
  EXPECT_EQ(evaluate(shifted, local), evaluate(mod, whole));
  EXPECT_EQ(shift_indices(mod, 0, 0), mod);
}

TEST(ScoreModSpec, MoreSlotsThanAGraphTakesAreRefused) {
  EXPECT_NO_THROW(parse_score_mod("add(add(add(add(add(add(add($0,$1),$2),$3),$4),$5),$6),$7)"));
  try {
    parse_score_mod("add(add(add(add(add(add(add(add($0,$1),$2),$3),$4),$5),$6),$7),$8)");
    ADD_FAILURE() << "nine scalars accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("at most 8 scalars and 4 tensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_score_mod("add(add(add(add(t0[h],t1[h]),t2[h]),t3[h]),t4[h])"), InvalidArgument);
}

}  // namespace
}  // namespace fusedattn
