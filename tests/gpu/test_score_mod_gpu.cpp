// GPU tier: score modifiers through cuDNN's flexible graphs against the CPU reference, which applies
// the same expression in float64 (outputs and gradients), with and without masks, padding and
// grouped heads; each operation on its own, so what cuDNN takes is on record; and the plan's
// independence from the runtime scalars' values.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/plan_cache.h"
#include "gpu_skip.h"
#include "supported_passes.h"
#include "testing/reference_check.h"

namespace fusedattn {
namespace {

struct ModCase {
  std::string name;
  std::string spec;               // without the modifier
  std::string score_mod;          // the expression
  std::vector<float> scalars;     // its $N values (empty: drawn)
};

void PrintTo(const ModCase& c, std::ostream* os) { *os << c.spec << " score_mod=" << c.score_mod; }

constexpr const char* kSoftcap = "mul(tanh(div(score,$0)),$0)";

std::vector<ModCase> mod_cases() {
  std::vector<ModCase> cases;
  auto add = [&](std::string name, std::string spec, std::string mod, std::vector<float> scalars = {}) {
    cases.push_back({std::move(name), std::move(spec), std::move(mod), std::move(scalars)});
  };
  // Softcap, the modifier everyone uses, over the masks cuDNN turns off beside a modifier (written
  // into the expression by the graph layer), padding and grouped heads.
  // Small enough for the CPU reference (about 3e8 multiply-adds a forward at most).
  const std::string gqa = " b=1 s_q=256 s_kv=400 h_q=8 h_kv=2 d=128";
  add("softcap_bf16", "layout=bshd dtype=bf16 b=2 s=256 h=4 d=64", kSoftcap, {2.0f});
  add("softcap_causal_f16", "layout=bshd dtype=f16 b=2 s=320 h=4 d=128 causal", kSoftcap, {2.0f});
  add("softcap_causal_br_gqa_bf16", "layout=bshd dtype=bf16" + gqa + " causal align=bottom_right", kSoftcap, {2.0f});
  add("softcap_swa_br_gqa_bf16", "layout=sbhd dtype=bf16" + gqa + " window=64,0 align=bottom_right", kSoftcap, {2.0f});
  add("softcap_band_tl_bf16", "layout=bshd dtype=bf16" + gqa + " window=40,16 align=top_left", kSoftcap, {2.0f});
  add("softcap_padding_causal_br_bf16", "layout=bshd dtype=bf16 b=3 s_q=333 s_kv=500 h_q=4 h_kv=2 d=64 padding=1 "
      "causal align=bottom_right", kSoftcap, {2.0f});
  add("softcap_padding_f16", "layout=bshd dtype=f16 b=3 s_q=200 s_kv=450 h=4 d=64 padding=1", kSoftcap, {1.5f});
  add("softcap_thd_bf16", "layout=thd_thd_thd dtype=bf16 b=3 s_q=300 s_kv=300 h_q=8 h_kv=2 d=64 causal", kSoftcap,
      {2.0f});
  // Without a mask: FlexAttention's document masks beside a score_mod run as these packed sequences.
  add("softcap_thd_no_mask_bf16", "layout=thd_thd_thd dtype=bf16 b=20 s_q=124 s_kv=124 h=8 d=64", kSoftcap, {2.0f});
  // Long causal calls, where most key tiles of a query tile lie past the diagonal band that cuDNN
  // skips (score_mod_lowering.cpp writes the window as the frontend's band mask): top-left and
  // bottom-right, tensors along the queries and along the keys.
  add("softcap_causal_2k_bf16", "layout=bshd dtype=bf16 b=1 s=2048 h=2 d=64 causal", kSoftcap, {2.0f});
  add("softcap_causal_2k_br_f16", "layout=bshd dtype=f16 b=1 s_q=2048 s_kv=3000 h=1 d=64 causal align=bottom_right",
      kSoftcap, {2.0f});
  add("alibi_causal_2304_bf16", "layout=sbhd dtype=bf16 b=1 s=2304 h=2 d=64 causal", "add(score,mul(t0[h],sub(kv,q)))");
  add("query_key_tensors_causal_2k_bf16", "layout=bshd dtype=bf16 b=1 s=2048 h=1 d=64 causal",
      "add(mul(score,t0[q]),t1[kv])");
  // The named modifiers of the issue, written in: ALiBi with custom slopes, a prefix-LM mask, a
  // causal sliding window in the expression itself.
  add("alibi_custom_slopes_bf16", "layout=bshd dtype=bf16 b=2 s=360 h=8 d=64 causal", "add(score,mul(t0[h],sub(kv,q)))");
  add("prefix_lm_bf16", "layout=bshd dtype=bf16 b=2 s=300 h=4 d=64", "select(or(le(kv,q),lt(kv,$0)),score,-inf)",
      {100.0f});
  add("sliding_window_written_in_f16", "layout=bshd dtype=f16 b=2 s=300 h=4 d=64",
      "select(and(le(kv,q),gt(kv,sub(q,64))),score,-inf)");
  // Small tensors of each broadcast shape.
  add("tensor_per_query_bf16", "layout=bshd dtype=bf16 b=2 s=256 h=4 d=64", "mul(score,t0[q])");
  add("tensor_per_key_bf16", "layout=bshd dtype=bf16 b=2 s=256 h=4 d=64", "add(score,t0[kv])");
  add("tensor_head_key_bf16", "layout=bshd dtype=bf16 b=2 s=256 h=4 d=64 causal", "add(score,t0[h,kv])");
  add("tensor_query_key_bf16", "layout=bshd dtype=bf16 b=2 s=256 h=4 d=64", "add(score,t0[q,kv])");
  add("tensor_batch_bf16", "layout=bshd dtype=bf16 b=2 s=256 h=4 d=64", "mul(score,add(t0[b],2))");
  // Each operation on its own (with the derivative the backward builds from it).
  const std::string small = "layout=bshd dtype=bf16 b=2 s=256 h=4 d=64";
  add("op_exp", small, "mul(score,exp(neg(abs(div(sub(kv,q),64)))))");
  add("op_log", small, "sub(score,log(add(abs(sub(kv,q)),1)))");
  add("op_sqrt", small, "sub(score,sqrt(abs(sub(kv,q))))");
  add("op_sigmoid", small, "mul(score,sigmoid(score))");
  add("op_pow", small, "sub(score,mul(0.1,pow(score,2)))");
  add("op_min_max", small, "max(min(score,$0),neg($0))", {1.0f});
  add("op_div_by_index", small, "div(score,add(abs(sub(kv,q)),1))");
  // A derivative that may overflow beside a causal mask: the window stays conditions, and the
  // backward masks dS again with them (score_mod_lowering.cpp).
  add("op_log_causal", "layout=bshd dtype=bf16 b=2 s=256 h=4 d=64 causal", "sub(score,log(add(abs(sub(kv,q)),1)))");
  add("op_reciprocal", small, "mul(score,div(1,add(abs(sub(kv,q)),1)))");
  add("op_cube", small, "add(score,mul(0.05,pow(score,3)))");
  add("op_select_on_score", small, "select(gt(score,0),score,mul(score,0.25))");
  add("op_sub_neg", small, "neg(sub($0,score))", {0.5f});
  add("op_eq_ne", small, "select(or(eq(kv,q),ne(h,1)),score,sub(score,1))");
  add("op_not_ge", small, "select(not(ge(q,kv)),sub(score,2),score)");
  add("op_bool_as_number", small, "add(score,mul(lt(kv,q),$0))", {0.75f});
  add("op_abs_score", small, "abs(score)");
  add("op_score_twice", small, "add(mul(score,score),score)");
  return cases;
}

class ScoreModNumerics : public ::testing::TestWithParam<ModCase> {};

TEST_P(ScoreModNumerics, MatchesReference) {
  FUSEDATTN_REQUIRE_GPU();
  const ModCase& c = GetParam();
  AttentionSpec spec = parse_spec(c.spec + " score_mod=" + c.score_mod);
  const Support forward = check_support(spec, Pass::forward);
  if (!forward.ok()) GTEST_SKIP() << "forward not supported: " << forward.to_string();
  const Support backward = check_support(spec, Pass::backward);
  check::CheckOptions options;
  options.backward = backward.ok();
  options.scale = 1.0;  // scores of a few units, where a cap of 1.5 - 2 and the bends matter
  options.score_mod_scalars = c.scalars;
  const check::CheckResult result = check::check_against_reference(spec, options);
  std::printf("  %s\n", result.to_string().c_str());
  EXPECT_TRUE(result.passed) << result.to_string();
  if (!backward.ok()) GTEST_SKIP() << "forward passed; backward not supported: " << backward.to_string();
}

INSTANTIATE_TEST_SUITE_P(Gpu, ScoreModNumerics, ::testing::ValuesIn(mod_cases()),
                         [](const ::testing::TestParamInfo<ModCase>& info) { return info.param.name; });

// The cap is a runtime scalar: other values run on the plan already built, and each gives its own
// (checked) result.
TEST(ScoreModPlans, ScalarValuesShareOnePlan) {
  FUSEDATTN_REQUIRE_GPU();
  const AttentionSpec spec = parse_spec(std::string("layout=bshd dtype=bf16 b=1 s=200 h=2 d=64 causal score_mod=") + kSoftcap);
  FUSEDATTN_REQUIRE_SUPPORTED_BOTH(spec);
  check::CheckOptions options;
  options.scale = 1.0;
  options.score_mod_scalars = {1.0f};
  ASSERT_TRUE(check::check_against_reference(spec, options).passed);
  const CacheStats before = plan_cache_stats();
  for (float cap : {0.5f, 3.0f, 30.0f}) {
    options.score_mod_scalars = {cap};
    const check::CheckResult result = check::check_against_reference(spec, options);
    EXPECT_TRUE(result.passed) << "cap " << cap << ": " << result.to_string();
  }
  EXPECT_EQ(plan_cache_stats().builds, before.builds) << "another cap built another plan";
}

// A modifier with a scalar refuses a call that gives none, naming the field, before any work.
TEST(ScoreModPlans, MissingValuesAreRefusedByName) {
  FUSEDATTN_REQUIRE_GPU();
  const AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=1 s=128 h=2 d=64 score_mod=add(mul(score,$0),t0[h])");
  FUSEDATTN_REQUIRE_SUPPORTED_BOTH(spec);
  auto plan = get_plan(spec, Pass::forward);
  ForwardTensors t;
  // Aligned stand-ins: the checks run before anything is read.
  alignas(16) static float dummy[64];
  t.q = t.k = t.v = dummy;
  t.o = dummy;
  t.stats = dummy;
  try {
    plan->run(t, 1.0f, nullptr);
    ADD_FAILURE() << "ran without the modifier's values";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "tensors.score_mod.scalars");
  }
  t.score_mod.scalars = dummy;
  try {
    plan->run(t, 1.0f, nullptr);
    ADD_FAILURE() << "ran without the modifier's tensor";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "tensors.score_mod.tensors[0]");
  }
}

}  // namespace
}  // namespace fusedattn
