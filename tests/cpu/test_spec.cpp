// Tier 1: the spec string — round trips for every layout and option, shorthands, errors, equality and hash.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/spec.h"

namespace fusedattn {
namespace {

ProblemShape shape_of(std::int64_t b, std::int64_t s_q, std::int64_t s_kv, std::int64_t h_q, std::int64_t h_kv,
                      std::int64_t d_qk, std::int64_t d_v, DType dtype = DType::bf16) {
  ProblemShape shape;
  shape.dtype = dtype;
  shape.batch = b;
  shape.seq_q = s_q;
  shape.seq_kv = s_kv;
  shape.heads_q = h_q;
  shape.heads_kv = h_kv;
  shape.head_dim_qk = d_qk;
  shape.head_dim_v = d_v;
  shape.page_size = s_kv;  // paged layouts: one page a sequence, and a spare page in the pool
  shape.pages = b + 1;
  return shape;
}

AttentionSpec spec_of(Layout layout, const ProblemShape& shape) {
  return spec_for_layout(layout, shape);
}

void expect_round_trip(const AttentionSpec& spec) {
  const std::string text = to_string(spec);
  AttentionSpec back = parse_spec(text);
  EXPECT_EQ(back, spec) << text;
  EXPECT_EQ(to_string(back), text);
  EXPECT_EQ(hash_value(back), hash_value(spec)) << text;
}

InvalidArgument parse_error(const std::string& text) {
  try {
    parse_spec(text);
  } catch (const InvalidArgument& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << text;
  return InvalidArgument("", "", "");
}

const char* const kBase = "layout=bshd dtype=bf16 b=2 s_q=1000 s_kv=1000 h_q=16 h_kv=16 d_qk=128 d_v=128";

TEST(SpecString, PrintsTheDocumentedShortForm) {
  AttentionSpec spec = spec_of(Layout::bshd, shape_of(2, 1000, 1000, 16, 16, 128, 128));
  EXPECT_EQ(to_string(spec), std::string(kBase));  // options at their defaults are left out
  spec.window = kCausal;
  spec.alignment = Alignment::bottom_right;
  spec.stats = false;
  EXPECT_EQ(to_string(spec), std::string(kBase) + " window=-1,0 align=bottom_right stats=0");
  spec.window = Window{256, 16};
  EXPECT_EQ(to_string(spec), std::string(kBase) + " window=256,16 align=bottom_right stats=0");
  spec.bias = Bias::one_11s;
  spec.bias_grad = true;
  spec.softmax = Softmax::sink;
  spec.max_logit = MaxLogit::head;
  spec.padding = true;
  EXPECT_EQ(to_string(spec), std::string(kBase) + " window=256,16 align=bottom_right bias=111s bias_grad=1 "
                                                  "softmax=sink max_logit=head padding=1 stats=0");
}

TEST(SpecString, EveryLayoutRoundTripsInShortForm) {
  for (Layout layout : all_layouts()) {
    ProblemShape shape = packs_qkv(layout) ? shape_of(3, 129, 129, 6, 6, 72, 72)
                         : packs_kv(layout) ? shape_of(3, 129, 77, 6, 2, 72, 72)
                                            : shape_of(3, 129, 77, 6, 2, 72, 40, DType::f16);
    AttentionSpec spec = spec_of(layout, shape);
    const std::string text = to_string(spec);
    EXPECT_EQ(text.rfind(std::string("layout=") + to_string(layout) + " ", 0), 0u) << text;
    expect_round_trip(spec);
  }
}

TEST(SpecString, EveryOptionComboRoundTrips) {
  for (Layout layout : all_layouts()) {
    for (Window window : {Window{}, kCausal, Window{16, 0}, Window{16, 4}, Window{-1, 8}, Window{32, -1}}) {
      for (Alignment alignment : {Alignment::top_left, Alignment::bottom_right}) {
        for (bool flag : {false, true}) {
          AttentionSpec spec = spec_of(layout, shape_of(1, 64, 64, 4, 4, 64, 64));
          spec.window = window;
          spec.alignment = alignment;
          spec.stats = flag;
          spec.padding = !flag;
          spec.deterministic = flag;
          expect_round_trip(spec);
        }
      }
    }
  }
}

TEST(SpecString, GqaAndDifferentHeadDimsRoundTrip) {
  expect_round_trip(spec_of(Layout::bshd, shape_of(2, 1, 4096, 32, 8, 128, 128)));    // GQA decode
  expect_round_trip(spec_of(Layout::bhsd, shape_of(2, 333, 1000, 16, 1, 192, 128)));  // MQA, MLA dims
  expect_round_trip(spec_of(Layout::sbhd, shape_of(1, 1, 1, 1, 1, 8, 8)));            // where layouts coincide
}

TEST(SpecString, OddStridesUseTheFullForm) {
  AttentionSpec spec = spec_of(Layout::bshd, shape_of(2, 100, 100, 4, 4, 64, 64));
  spec.k.strides = {100 * 4 * 80, 80, 4 * 80, 1};  // K rows padded to 80 elements
  spec.o.dtype = DType::f16;
  spec.window = kCausal;
  const std::string text = to_string(spec);
  EXPECT_EQ(text.rfind("q=bf16[2,4,100,64]/[25600,64,256,1] k=bf16[2,4,100,64]/[32000,80,320,1] ", 0), 0u) << text;
  EXPECT_NE(text.find(" o=f16[2,4,100,64]/[25600,64,256,1] window=-1,0"), std::string::npos)
      << text;
  expect_round_trip(spec);
}

TEST(SpecLayout, NamedLayoutFindsExactMatchesOnly) {
  for (Layout layout : all_layouts()) {
    ProblemShape shape = shape_of(3, 40, 40, 6, 6, 64, 64);
    EXPECT_EQ(named_layout(spec_of(layout, shape)), layout) << to_string(layout);
  }
  AttentionSpec padded = spec_of(Layout::bshd, shape_of(2, 100, 100, 4, 4, 64, 64));
  padded.k.strides = {100 * 4 * 80, 80, 4 * 80, 1};
  EXPECT_EQ(named_layout(padded), std::nullopt);
  ProblemShape shape = problem_shape(padded);
  EXPECT_EQ(shape.batch, 2);
  EXPECT_EQ(shape.seq_kv, 100);
  EXPECT_EQ(shape.head_dim_v, 64);
}

TEST(SpecString, InvalidSpecsStillRoundTrip) {
  AttentionSpec empty;  // all-zero tensors: printing must not throw, and parses back
  expect_round_trip(empty);
  AttentionSpec negative = spec_of(Layout::bshd, shape_of(1, 8, 8, 2, 2, 8, 8));
  negative.v.strides = {-128, 8, -16, 1};
  expect_round_trip(negative);
  AttentionSpec mismatched = spec_of(Layout::bs3hd, shape_of(1, 8, 8, 2, 2, 8, 8));
  mismatched.k.dims[kSeq] = 9;  // no layout gives this: full form
  expect_round_trip(mismatched);
  EXPECT_EQ(to_string(mismatched).rfind("q=", 0), 0u);
}

TEST(SpecString, ShorthandsMatchTheLongForm) {
  AttentionSpec long_form = parse_spec("layout=sbhd dtype=f16 b=1 s_q=256 s_kv=256 h_q=8 h_kv=8 d_qk=64 d_v=64 causal=1");
  EXPECT_EQ(parse_spec("layout=sbhd dtype=f16 b=1 s=256 h=8 d=64 causal"), long_form);
  EXPECT_EQ(parse_spec("d=64 causal=1 h=8 s=256 b=1 dtype=half layout=sbhd"), long_form);  // any order
  EXPECT_EQ(long_form.window, kCausal);
  EXPECT_EQ(parse_spec("layout=sbhd dtype=f16 b=1 s=256 h=8 d=64 window=-1,0"), long_form);
  EXPECT_EQ(long_form.seq_kv(), 256);
  EXPECT_EQ(long_form.head_dim_v(), 64);
}

TEST(SpecString, SpecificKeysWinOverShorthandsInAnyOrder) {
  AttentionSpec gqa = parse_spec("layout=bshd b=2 s=128 h=12 h_kv=4 d=64");
  EXPECT_EQ(gqa.heads_q(), 12);
  EXPECT_EQ(gqa.heads_kv(), 4);
  EXPECT_EQ(parse_spec("layout=bshd b=2 h_kv=4 s=128 h=12 d=64"), gqa);
  AttentionSpec mla = parse_spec("layout=bhsd b=1 s_q=1 s=512 h=16 d=128 d_qk=192");
  EXPECT_EQ(mla.seq_q(), 1);
  EXPECT_EQ(mla.seq_kv(), 512);
  EXPECT_EQ(mla.head_dim_qk(), 192);
  EXPECT_EQ(mla.head_dim_v(), 128);
  EXPECT_EQ(mla, parse_spec(to_string(mla)));
}

TEST(SpecString, LayoutAndDtypeDefaultToBshdBf16) {
  AttentionSpec spec = parse_spec("b=2 s=128 h=4 d=64");
  EXPECT_EQ(spec, spec_of(Layout::bshd, shape_of(2, 128, 128, 4, 4, 64, 64)));
  EXPECT_EQ(spec.q.dtype, DType::bf16);
  EXPECT_TRUE(spec.stats);
  EXPECT_EQ(spec.window, Window{});
}

TEST(SpecString, ExtraWhitespaceIsFine) {
  EXPECT_EQ(parse_spec("  b=2\ts=128   h=4 d=64 \n"), parse_spec("b=2 s=128 h=4 d=64"));
}

TEST(SpecErrors, UnknownKeyListsTheKnownOnes) {
  InvalidArgument e = parse_error(std::string(kBase) + " softcap=30");
  EXPECT_EQ(e.field(), "softcap");
  EXPECT_EQ(e.value(), "30");
  for (const char* key : {"layout", "s_kv", "d_v", "causal", "window", "align", "stats", "q"}) {
    EXPECT_NE(e.requirement().find(key), std::string::npos) << key;
  }
  EXPECT_EQ(parse_error(std::string(kBase) + " flash").field(), "flash");
}

TEST(SpecErrors, BadValuesNameTheirKey) {
  struct Case {
    std::string extra, field, value;
  };
  const std::vector<Case> cases = {
      {"causal=2", "causal", "2"},         {"align=diagonal", "align", "diagonal"}, {"stats=yes", "stats", "yes"},
      {"causal=", "causal", ""},           {"window=5", "window", "5"},             {"window=a,0", "window", "a,0"},
      {"window=1,", "window", "1,"},       {"bias=bsss", "bias", "bsss"},           {"softmax=relu", "softmax", "relu"},
      {"max_logit=all", "max_logit", "all"},     {"dropout=abc", "dropout", "abc"},     {"dropout=0.1x", "dropout", "0.1x"},
  };
  for (const Case& c : cases) {
    InvalidArgument e = parse_error(std::string(kBase) + " " + c.extra);
    EXPECT_EQ(e.field(), c.field) << c.extra;
    EXPECT_EQ(e.value(), c.value) << c.extra;
  }
  const std::vector<Case> sizes = {
      {"layout=bhds dtype=bf16 b=2 s=8 h=1 d=8", "layout", "bhds"},
      {"dtype=fp32 b=2 s=8 h=1 d=8", "dtype", "fp32"},
      {"b=two s=8 h=1 d=8", "b", "two"},
      {"b=2 s=8x h=1 d=8", "s", "8x"},
      {"b=2 s_q=8 s_kv=1.5 h=1 d=8", "s_kv", "1.5"},
      {"b=2 s=8 h=1 d=0", "d_qk", "0"},
      {"b=-1 s=8 h=1 d=8", "b", "-1"},
      {"layout=bs3hd b=2 s_q=8 s_kv=16 h=1 d=8", "layout", "bs3hd"},
  };
  for (const Case& c : sizes) {
    InvalidArgument e = parse_error(c.extra);
    EXPECT_EQ(e.field(), c.field) << c.extra;
    EXPECT_EQ(e.value(), c.value) << c.extra;
  }
}

TEST(SpecErrors, MalformedTensorNamesIt) {
  const std::string good = "bf16[1,1,8,8]/[64,64,8,1]";
  InvalidArgument e = parse_error("q=" + good + " k=bf16[1,1,8]/[64,64,8,1] v=" + good + " o=" + good);
  EXPECT_EQ(e.field(), "k");
  EXPECT_EQ(e.value(), "bf16[1,1,8]/[64,64,8,1]");
}

TEST(SpecErrors, MissingSizesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "b"},
      {"b=1 s_q=8 h=2 d=8", "s_kv"},
      {"b=1 s=8 h_q=2 d=8", "h_kv"},
      {"b=1 s=8 h=2 d_qk=8", "d_v"},
      {"s=8 h=2 d=8 causal", "b"},
  };
  for (const auto& [text, field] : cases) {
    InvalidArgument e = parse_error(text);
    EXPECT_EQ(e.field(), field) << text;
    EXPECT_NE(e.requirement().find("s_q"), std::string::npos);
  }
}

TEST(SpecErrors, DuplicatesAreRejected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"b=2 b=2 s=8 h=1 d=8", "b"},
      {"b=2 s=8 s=8 h=1 d=8", "s"},
      {"b=2 s=8 s_q=8 s_q=4 h=1 d=8", "s_q"},
      {"b=2 s=8 h=1 d=8 causal causal=1", "causal"},
      {"b=2 s=8 h=1 d=8 causal=0 causal", "causal"},
      {"b=2 s=8 h=1 d=8 window=4,0 window=4,-1", "window"},
      {"b=2 s=8 h=1 d=8 stats=1 stats=0", "stats"},
      {"layout=bshd layout=sbhd b=2 s=8 h=1 d=8", "layout"},
  };
  for (const auto& [text, field] : cases) {
    InvalidArgument e = parse_error(text);
    EXPECT_EQ(e.field(), field) << text;
    EXPECT_NE(e.requirement().find("once"), std::string::npos) << e.what();
  }
  const std::string t = "bf16[1,1,8,8]/[64,64,8,1]";
  EXPECT_EQ(parse_error("q=" + t + " q=" + t + " k=" + t + " v=" + t + " o=" + t).field(), "q");
}

// `causal` has one meaning (causal_window, fusedattn/options.h): no key right of the diagonal. It
// closes the window's right side, keeps its left, and refuses a window that looks ahead.
TEST(CausalWindow, ClosesTheRightSideAndKeepsTheLeft) {
  EXPECT_EQ(causal_window(Window{}), kCausal);
  EXPECT_EQ(causal_window(kCausal), kCausal);
  EXPECT_EQ(causal_window(Window{100, -1}), (Window{100, 0}));
  EXPECT_EQ(causal_window(Window{100, 0}), (Window{100, 0}));
}

TEST(CausalWindow, RefusesAWindowThatLooksAhead) {
  for (const Window& ahead : {Window{100, 5}, Window{-1, 1}, Window{100, -2}}) {
    try {
      causal_window(ahead);
      ADD_FAILURE() << to_string(ahead) << " was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.field(), "window");
      EXPECT_EQ(e.value(), to_string(ahead));
      EXPECT_EQ(e.requirement(), "a right bound of 0 or -1 with causal (causal closes the window's right side)");
    }
  }
  EXPECT_STREQ(parse_error(std::string(kBase) + " causal window=100,5").what(),
               "window = 100,5: a right bound of 0 or -1 with causal (causal closes the window's right side)");
}

TEST(SpecCausal, AloneIsTheCausalWindow) {
  EXPECT_EQ(parse_spec(std::string(kBase) + " causal").window, kCausal);
  EXPECT_EQ(parse_spec(std::string(kBase) + " causal=1").window, kCausal);
  EXPECT_EQ(parse_spec(std::string(kBase) + " causal=1"), parse_spec(std::string(kBase) + " window=-1,0"));
}

TEST(SpecCausal, BesideAWindowInAnyOrder) {
  const std::vector<std::pair<std::string, Window>> cases = {
      {" causal window=100,-1", {100, 0}}, {" window=100,-1 causal", {100, 0}}, {" causal=1 window=100,0", {100, 0}},
      {" window=100,0 causal", {100, 0}},  {" window=-1,-1 causal", kCausal},  {" window=-1,0 causal", kCausal},
  };
  for (const auto& [extra, window] : cases) EXPECT_EQ(parse_spec(std::string(kBase) + extra).window, window) << extra;
  EXPECT_EQ(parse_spec(std::string(kBase) + " causal window=100,-1"), parse_spec(std::string(kBase) + " window=100,0"));
}

TEST(SpecCausal, ZeroLeavesTheWindowAsGiven) {
  EXPECT_EQ(parse_spec(std::string(kBase) + " causal=0").window, Window{});
  EXPECT_EQ(parse_spec(std::string(kBase) + " causal=0 window=100,5").window, (Window{100, 5}));
  EXPECT_EQ(parse_spec(std::string(kBase) + " window=7,-1 causal=0").window, (Window{7, -1}));
}

TEST(SpecCausal, ASlidingWindowPrintsAndParsesBack) {
  const AttentionSpec spec = parse_spec("layout=bshd b=2 s=512 h=8 d=64 causal window=128,-1 align=bottom_right");
  EXPECT_EQ(spec.window, (Window{128, 0}));
  const std::string text = to_string(spec);
  EXPECT_NE(text.find(" window=128,0"), std::string::npos) << text;
  expect_round_trip(spec);
}

TEST(SpecErrors, FullFormNeedsAllTensorsAndNoLayoutKeys) {
  const std::string t = "bf16[1,1,8,8]/[64,64,8,1]";
  InvalidArgument missing = parse_error("q=" + t + " k=" + t + " v=" + t + " causal=1");
  EXPECT_EQ(missing.field(), "o");
  InvalidArgument mixed = parse_error("q=" + t + " k=" + t + " v=" + t + " o=" + t + " b=1");
  EXPECT_EQ(mixed.field(), "b");
  EXPECT_EQ(mixed.value(), "1");
  EXPECT_EQ(parse_error("layout=bshd q=" + t + " k=" + t + " v=" + t + " o=" + t).field(), "layout");
}

// Every field, changed alone, changes equality, the hash and the printed string.
TEST(SpecIdentity, EverySingleFieldChangeIsSeen) {
  const AttentionSpec base = spec_of(Layout::bshd, shape_of(2, 64, 96, 8, 4, 64, 64));
  std::vector<std::pair<std::string, std::function<void(AttentionSpec&)>>> mutations;
  const std::vector<std::pair<std::string, TensorDesc AttentionSpec::*>> tensors = {
      {"q", &AttentionSpec::q}, {"k", &AttentionSpec::k}, {"v", &AttentionSpec::v}, {"o", &AttentionSpec::o}};
  for (const auto& [name, member] : tensors) {
    auto m = member;
    mutations.emplace_back(name + ".dtype", [m](AttentionSpec& s) { (s.*m).dtype = DType::f16; });
    for (int i = 0; i < 4; ++i) {
      mutations.emplace_back(name + ".dims[" + std::to_string(i) + "]", [m, i](AttentionSpec& s) { (s.*m).dims[i] += 1; });
      mutations.emplace_back(name + ".strides[" + std::to_string(i) + "]",
                             [m, i](AttentionSpec& s) { (s.*m).strides[i] += 1; });
    }
  }
  mutations.emplace_back("window.left", [](AttentionSpec& s) { s.window.left = 64; });
  mutations.emplace_back("window.right", [](AttentionSpec& s) { s.window.right = 0; });
  mutations.emplace_back("alignment", [](AttentionSpec& s) { s.alignment = Alignment::bottom_right; });
  mutations.emplace_back("bias", [](AttentionSpec& s) { s.bias = Bias::b1ss; });
  mutations.emplace_back("bias_grad", [](AttentionSpec& s) { s.bias_grad = true; });
  mutations.emplace_back("alibi", [](AttentionSpec& s) { s.alibi = true; });
  mutations.emplace_back("softmax", [](AttentionSpec& s) { s.softmax = Softmax::off_by_one; });
  mutations.emplace_back("max_logit", [](AttentionSpec& s) { s.max_logit = MaxLogit::row; });
  mutations.emplace_back("dropout", [](AttentionSpec& s) { s.dropout = 0.125; });
  mutations.emplace_back("dropout_mask_out", [](AttentionSpec& s) { s.dropout_mask_out = true; });
  mutations.emplace_back("padding", [](AttentionSpec& s) { s.padding = true; });
  mutations.emplace_back("deterministic", [](AttentionSpec& s) { s.deterministic = true; });
  mutations.emplace_back("stats", [](AttentionSpec& s) { s.stats = false; });
  ASSERT_EQ(mutations.size(), 4u * 9u + 13u);

  for (const auto& [name, mutate] : mutations) {
    AttentionSpec changed = base;
    mutate(changed);
    EXPECT_NE(changed, base) << name;
    EXPECT_FALSE(changed == base) << name;
    EXPECT_NE(hash_value(changed), hash_value(base)) << name;
    EXPECT_NE(std::hash<AttentionSpec>{}(changed), std::hash<AttentionSpec>{}(base)) << name;
    EXPECT_NE(to_string(changed), to_string(base)) << name;
    expect_round_trip(changed);
  }
  AttentionSpec copy = base;
  EXPECT_EQ(copy, base);
  EXPECT_EQ(hash_value(copy), hash_value(base));
}

TEST(SpecFlops, UsualConvention) {
  AttentionSpec spec = spec_of(Layout::bshd, shape_of(2, 1024, 2048, 16, 4, 128, 64));
  const double full = 4.0 * 2 * 16 * 1024 * 2048 * (128 + 64) / 2;
  EXPECT_DOUBLE_EQ(spec.forward_flops(), full);
  spec.window = kCausal;
  EXPECT_DOUBLE_EQ(spec.forward_flops(), full / 2);
  // A window counts its visible pairs exactly: here every query row sees 100 keys.
  spec.window = Window{100, 0};
  spec.alignment = Alignment::bottom_right;
  EXPECT_DOUBLE_EQ(spec.forward_flops(), 4.0 * 2 * 16 * 1024 * 100 * (128 + 64) / 2);
}

TEST(SpecAlignment, Names) {
  EXPECT_STREQ(to_string(Alignment::top_left), "top_left");
  EXPECT_STREQ(to_string(Alignment::bottom_right), "bottom_right");
}

TEST(SpecString, DropoutProbabilitiesRoundTripExactly) {
  AttentionSpec spec = spec_of(Layout::bshd, shape_of(2, 64, 64, 4, 4, 64, 64));
  for (double p : {0.1, 0.25, 1.0 / 3.0, 0.123456789012345, 1e-7}) {
    spec.dropout = p;
    expect_round_trip(spec);
  }
  spec.dropout = 0.1;
  EXPECT_NE(to_string(spec).find(" dropout=0.1"), std::string::npos) << to_string(spec);
}

}  // namespace
}  // namespace fusedattn
