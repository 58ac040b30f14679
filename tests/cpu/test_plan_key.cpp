// Tier 1: plan cache keys — what splits entries, what must not, printing, and the capacity setting.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/plan_cache.h"
#include "made_up_versions.h"

namespace fusedattn {
namespace {

AttentionSpec spec_of(const std::string& text) { return parse_spec(text); }

const char* const kSpec = "layout=bshd dtype=bf16 b=2 s_q=128 s_kv=128 h_q=8 h_kv=8 d_qk=64 d_v=64 window=-1,0";

Versions versions(int runtime, int frontend) { return made_up_versions(runtime, frontend); }

PlanKey base_key(Pass pass = Pass::forward) {
  return make_plan_key(spec_of(kSpec), pass, 0, DeviceCaps{9, 0}, versions(91900, 13200));
}

TEST(PlanKey, FillsDeviceAndVersions) {
  PlanKey key = make_plan_key(spec_of(kSpec), Pass::backward, 3, DeviceCaps{8, 6}, versions(90500, 11000));
  EXPECT_EQ(key.pass, Pass::backward);
  EXPECT_EQ(key.device, 3);
  EXPECT_EQ(key.sm, 86);
  EXPECT_EQ(key.cudnn_runtime, 90500);
  EXPECT_EQ(key.frontend, 11000);
  EXPECT_EQ(key.spec, spec_of(kSpec));
}

TEST(PlanKey, EqualSpecsGiveEqualKeys) {
  PlanKey a = base_key();
  PlanKey b = make_plan_key(spec_of("layout=bshd b=2 s=128 h=8 d=64 causal"), Pass::forward, 0, DeviceCaps{9, 0},
                            versions(91900, 13200));
  EXPECT_EQ(a, b);
  EXPECT_EQ(PlanKeyHash{}(a), PlanKeyHash{}(b));
}

TEST(PlanKey, EachPartSplitsEntries) {
  const PlanKey base = base_key();
  std::vector<std::pair<std::string, PlanKey>> variants = {
      {"pass", base_key(Pass::backward)},
      {"device", make_plan_key(spec_of(kSpec), Pass::forward, 1, DeviceCaps{9, 0}, versions(91900, 13200))},
      {"sm", make_plan_key(spec_of(kSpec), Pass::forward, 0, DeviceCaps{10, 0}, versions(91900, 13200))},
      {"sm minor", make_plan_key(spec_of(kSpec), Pass::forward, 0, DeviceCaps{9, 1}, versions(91900, 13200))},
      {"cudnn", make_plan_key(spec_of(kSpec), Pass::forward, 0, DeviceCaps{9, 0}, versions(91901, 13200))},
      {"frontend", make_plan_key(spec_of(kSpec), Pass::forward, 0, DeviceCaps{9, 0}, versions(91900, 13300))},
      {"spec", make_plan_key(spec_of("layout=bshd b=2 s=128 h=8 d=64"), Pass::forward, 0, DeviceCaps{9, 0},
                             versions(91900, 13200))},
      {"tuned", [] {
         PlanKey key = base_key();
         key.tuned = true;  // autotune's choice and the heuristics' are separate entries
         return key;
       }()},
  };
  std::unordered_set<PlanKey, PlanKeyHash> all = {base};
  for (const auto& [name, key] : variants) {
    EXPECT_NE(key, base) << name;
    EXPECT_NE(PlanKeyHash{}(key), PlanKeyHash{}(base)) << name;
    EXPECT_NE(to_string(key), to_string(base)) << name;
    all.insert(key);
  }
  EXPECT_EQ(all.size(), variants.size() + 1);
}

// Each option against the passes whose graphs read it (the field table in spec.cpp): a change splits
// exactly those passes' entries. bias_grad once split forward entries, giving two identical plans.
TEST(PlanKey, EachOptionSplitsExactlyThePassesThatReadIt) {
  struct Case {
    const char* base;
    const char* changed;
    bool forward_reads, backward_reads;
  };
  const char* const plain = "layout=bshd b=2 s=128 h=8 d=64 causal";
  const char* const biased = "layout=bshd b=2 s=128 h=8 d=64 causal bias=11ss";
  const char* const dropped = "layout=bshd b=2 s=128 h=8 d=64 causal dropout=0.1";
  const char* const fp8 = "layout=bshd dtype=e4m3 b=2 s=128 h=8 d=64 causal";
  const Case cases[] = {
      {biased, "layout=bshd b=2 s=128 h=8 d=64 causal bias=11ss bias_grad=1", false, true},
      {plain, "layout=bshd b=2 s=128 h=8 d=64 causal deterministic=1", false, true},
      {plain, "layout=bshd b=2 s=128 h=8 d=64 causal stats=0", true, false},
      {plain, "layout=bshd b=2 s=128 h=8 d=64 causal max_logit=row", true, false},
      {dropped, "layout=bshd b=2 s=128 h=8 d=64 causal dropout=0.1 dropout_mask_out=1", true, false},
      {plain, "layout=bshd b=2 s=128 h=8 d=64 causal bias=11ss", true, true},
      {plain, "layout=bshd b=2 s=128 h=8 d=64 causal softmax=off_by_one", true, true},
      {plain, "layout=bshd b=2 s=128 h=8 d=64 causal dropout=0.1", true, true},
      {plain, "layout=bshd b=2 s=128 h=8 d=64 causal padding=1", true, true},
      {plain, "layout=bshd b=2 s=128 h=8 d=64 window=16,0", true, true},
      {plain, "layout=bshd b=2 s=128 h=8 d=64 causal alibi=1", true, true},
      {fp8, "layout=bshd dtype=e4m3 b=2 s=128 h=8 d=64 causal fp8_scaling=mxfp8", true, true},
      {fp8, "layout=bshd dtype=e4m3 b=2 s=128 h=8 d=64 causal fp8_grads=e5m2", false, true},
  };
  for (const Case& c : cases) {
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const bool reads = pass == Pass::forward ? c.forward_reads : c.backward_reads;
      const PlanKey a = make_plan_key(spec_of(c.base), pass, 0, DeviceCaps{9, 0}, versions(91900, 13200));
      const PlanKey b = make_plan_key(spec_of(c.changed), pass, 0, DeviceCaps{9, 0}, versions(91900, 13200));
      EXPECT_EQ(a != b, reads) << to_string(pass) << ": " << c.changed;
      if (!reads) EXPECT_EQ(PlanKeyHash{}(a), PlanKeyHash{}(b)) << to_string(pass) << ": " << c.changed;
    }
  }
}

TEST(PlanKey, BackwardIgnoresStats) {
  AttentionSpec with = spec_of(kSpec);
  AttentionSpec without = with;
  without.stats = false;
  const DeviceCaps caps{9, 0};
  const Versions v = versions(91900, 13200);
  PlanKey back_with = make_plan_key(with, Pass::backward, 0, caps, v);
  PlanKey back_without = make_plan_key(without, Pass::backward, 0, caps, v);
  EXPECT_EQ(back_with, back_without);
  EXPECT_EQ(PlanKeyHash{}(back_with), PlanKeyHash{}(back_without));
  EXPECT_TRUE(back_without.spec.stats);
  // Forward writes the statistics or not: different graphs, different entries.
  EXPECT_NE(make_plan_key(with, Pass::forward, 0, caps, v), make_plan_key(without, Pass::forward, 0, caps, v));
}

TEST(PlanKey, DeterminismSplitsOnlyBackwardEntries) {
  const DeviceCaps caps{9, 0};
  const Versions v = versions(91900, 13200);
  AttentionSpec fast = spec_of(kSpec);
  AttentionSpec reproducible = fast;
  reproducible.deterministic = true;
  EXPECT_EQ(make_plan_key(fast, Pass::forward, 0, caps, v), make_plan_key(reproducible, Pass::forward, 0, caps, v));
  EXPECT_NE(make_plan_key(fast, Pass::backward, 0, caps, v), make_plan_key(reproducible, Pass::backward, 0, caps, v));
}

TEST(PlanKey, ForwardOnlyOutputsDoNotSplitBackwardEntries) {
  const DeviceCaps caps{9, 0};
  const Versions v = versions(91900, 13200);
  AttentionSpec plain = spec_of(kSpec);
  plain.dropout = 0.1;
  AttentionSpec outputs = plain;
  outputs.dropout_mask_out = true;
  outputs.max_logit = MaxLogit::row;
  EXPECT_EQ(make_plan_key(plain, Pass::backward, 0, caps, v), make_plan_key(outputs, Pass::backward, 0, caps, v));
  EXPECT_NE(make_plan_key(plain, Pass::forward, 0, caps, v), make_plan_key(outputs, Pass::forward, 0, caps, v));
}

// The alignment matters only where it moves the diagonal: with a bound, and lengths that differ (or
// arrive at run time). Elsewhere bottom-right shares top-left's plan.
TEST(PlanKey, AlignmentMattersOnlyWhereItMovesTheDiagonal) {
  const DeviceCaps caps{9, 0};
  const Versions v = versions(91900, 13200);
  auto keys_equal = [&](const char* text, const Window& window, bool padding) {
    AttentionSpec top_left = spec_of(text);
    top_left.window = window;
    top_left.padding = padding;
    AttentionSpec bottom_right = top_left;
    bottom_right.alignment = Alignment::bottom_right;
    return make_plan_key(top_left, Pass::forward, 0, caps, v) == make_plan_key(bottom_right, Pass::forward, 0, caps, v) &&
           make_plan_key(top_left, Pass::backward, 0, caps, v) == make_plan_key(bottom_right, Pass::backward, 0, caps, v);
  };
  const char* const longer_kv = "layout=bshd dtype=bf16 b=2 s_q=128 s_kv=192 h_q=8 h_kv=8 d_qk=64 d_v=64";
  EXPECT_TRUE(keys_equal(kSpec, Window{}, false));
  EXPECT_TRUE(keys_equal(longer_kv, Window{}, false));
  EXPECT_TRUE(keys_equal(kSpec, kCausal, false));       // s_q == s_kv: the same diagonal
  EXPECT_FALSE(keys_equal(kSpec, kCausal, true));       // runtime lengths may differ
  EXPECT_FALSE(keys_equal(longer_kv, kCausal, false));  // the diagonal moves by 64
}

TEST(PlanKey, PrintsPassDeviceVersionsThenSpec) {
  EXPECT_EQ(to_string(base_key()), std::string("forward device=0 sm=90 cudnn=91900 fe=13200 ") + kSpec);
  EXPECT_EQ(to_string(base_key(Pass::backward)).rfind("backward device=0 sm=90 cudnn=91900 fe=13200 layout=bshd", 0), 0u);
  PlanKey tuned = base_key();
  tuned.tuned = true;
  EXPECT_EQ(to_string(tuned), std::string("forward tuned device=0 sm=90 cudnn=91900 fe=13200 ") + kSpec);
}

TEST(PlanKeyCapacity, ParsesPositiveIntegers) {
  EXPECT_EQ(parse_cache_capacity("1", "FUSEDATTN_PLAN_CACHE_CAP"), 1u);
  EXPECT_EQ(parse_cache_capacity("4096", "FUSEDATTN_PLAN_CACHE_CAP"), 4096u);
}

TEST(PlanKeyCapacity, RejectsEverythingElseNamingTheVariable) {
  for (const char* text : {"", "0", "-5", "abc", "12x", " 12", "1.5", "99999999999999999999999"}) {
    try {
      parse_cache_capacity(text, "FUSEDATTN_PLAN_CACHE_CAP");
      FAIL() << "accepted '" << text << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.field(), "FUSEDATTN_PLAN_CACHE_CAP");
      EXPECT_EQ(e.value(), text);
      EXPECT_NE(e.requirement().find("positive integer"), std::string::npos);
    }
  }
  try {
    parse_cache_capacity(nullptr, "FUSEDATTN_PLAN_CACHE_CAP");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "FUSEDATTN_PLAN_CACHE_CAP");
  }
}

TEST(PlanKeyEvents, Names) {
  EXPECT_STREQ(to_string(CacheEvent::hit), "hit");
  EXPECT_STREQ(to_string(CacheEvent::miss), "miss");
  EXPECT_STREQ(to_string(CacheEvent::build), "build");
  EXPECT_STREQ(to_string(CacheEvent::build_failed), "build_failed");
  EXPECT_STREQ(to_string(CacheEvent::eviction), "eviction");
}

TEST(PlanKeyEvents, KeysWorkInTheLruCache) {
  LruCache<PlanKey, int, PlanKeyHash> cache(4);
  int builds = 0;
  auto build = [&](const PlanKey&) { return std::make_shared<const int>(++builds); };
  EXPECT_EQ(*cache.get_or_build(base_key(), build), 1);
  EXPECT_EQ(*cache.get_or_build(base_key(), build), 1);
  EXPECT_EQ(*cache.get_or_build(base_key(Pass::backward), build), 2);
  EXPECT_EQ(cache.stats().builds, 2u);
}

}  // namespace
}  // namespace fusedattn
