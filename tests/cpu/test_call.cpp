// Tier 1: the adapter boundary (fusedattn/call.h) — configs from keyword terms, specs from
// framework tensors, bias kinds, the config registry, and the messages every adapter shares.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedattn/call.h"
#include "fusedattn/errors.h"
#include "fusedattn/layout.h"

namespace fusedattn {
namespace {

using Options = std::vector<std::pair<std::string, std::string>>;

// A contiguous tensor of `sizes` in its own axis order.
TensorView dense(std::vector<std::int64_t> sizes, DType dtype = DType::bf16) {
  TensorView view;
  view.dtype = dtype;
  view.rank = static_cast<int>(sizes.size());
  std::int64_t step = 1;
  for (int axis = view.rank - 1; axis >= 0; --axis) {
    view.sizes[axis] = sizes[axis];
    view.strides[axis] = step;
    step *= sizes[axis];
  }
  return view;
}

CallShape shape_of(TensorView q, TensorView k, TensorView v) {
  CallShape shape;
  shape.q = q;
  shape.k = k;
  shape.v = v;
  return shape;
}

std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(CallConfig, ReadsOptionsInTheSpecStringsTerms) {
  const CallConfig config = make_call_config(
      "sbhd", "", {{"window", "-1,-1"}, {"causal", "1"}, {"align", "bottom_right"}, {"softmax", "off_by_one"}});
  EXPECT_EQ(config.layout, AxisOrder::sbhd);
  EXPECT_EQ(config.kv_layout, AxisOrder::sbhd);
  EXPECT_EQ(config.options.window, kCausal);
  EXPECT_EQ(config.options.alignment, Alignment::bottom_right);
  EXPECT_EQ(config.options.softmax, Softmax::off_by_one);
  EXPECT_EQ(to_string(config), "layout=sbhd window=-1,0 align=bottom_right softmax=off_by_one");
}

TEST(CallConfig, PrintsAndParsesBack) {
  const CallConfig config = make_call_config(
      "thd", "bshd", {{"causal", "1"}, {"padding", "1"}, {"dropout", "0.125"}, {"bias", "111s"}, {"max_logit", "head"}});
  EXPECT_EQ(parse_call_config(to_string(config)), config) << to_string(config);
  EXPECT_EQ(parse_call_config("layout=bshd"), CallConfig{});
}

TEST(CallConfig, CausalClosesAWindowOnTheRightWhateverTheOrder) {
  const CallConfig a = make_call_config("bshd", "", {{"causal", "1"}, {"window", "128,-1"}});
  const CallConfig b = make_call_config("bshd", "", {{"window", "128,-1"}, {"causal", "1"}});
  EXPECT_EQ(a.options.window, (Window{128, 0}));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, make_call_config("bshd", "", {{"window", "128,-1"}}));
}

TEST(CallConfig, CausalMeansWhatTheSpecStringsCausalMeans) {
  const std::string base = "layout=bshd b=1 s=64 h=2 d=64 ";
  const std::vector<std::pair<Options, std::string>> cases = {
      {{{"causal", "1"}}, "causal"},
      {{{"causal", "1"}, {"window", "100,-1"}}, "causal window=100,-1"},
      {{{"window", "100,0"}, {"causal", "1"}}, "window=100,0 causal"},
      {{{"causal", "0"}, {"window", "100,5"}}, "causal=0 window=100,5"},
  };
  for (const auto& [options, spec_text] : cases) {
    EXPECT_EQ(make_call_config("bshd", "", options).options.window, parse_spec(base + spec_text).window) << spec_text;
  }
  EXPECT_EQ(make_call_config("bshd", "", {{"causal", "1"}, {"window", "100,-1"}}).options.window, (Window{100, 0}));
  EXPECT_EQ(make_call_config("bshd", "", {{"causal", "0"}, {"window", "100,5"}}).options.window, (Window{100, 5}));
}

TEST(CallConfig, CausalBesideAWindowThatLooksAheadIsRefusedAsTheParserRefusesIt) {
  // Not cut to (100, 0) behind the caller's back: the words of `fusedattn support "... causal window=100,5"`.
  const std::string from_config =
      message_of([] { make_call_config("bshd", "", {{"window", "100,5"}, {"causal", "1"}}); });
  EXPECT_EQ(from_config,
            "window = 100,5: a right bound of 0 or -1 with causal (causal closes the window's right side)");
  EXPECT_EQ(from_config, message_of([] { parse_spec("layout=bshd b=1 s=8 h=1 d=8 causal window=100,5"); }));
  EXPECT_EQ(from_config, message_of([] { parse_call_config("layout=bshd window=100,5 causal=1"); }));
}

TEST(CallConfig, BadOptionsGetTheParsersMessages) {
  // The same words as `fusedattn run "... align=diagonal"`: both come from the spec's field table.
  const std::string from_config = message_of([] { make_call_config("bshd", "", {{"align", "diagonal"}}); });
  const std::string from_parser = message_of([] { parse_spec("layout=bshd b=1 s=8 h=1 d=8 align=diagonal"); });
  EXPECT_EQ(from_config, from_parser);
  EXPECT_NE(from_config.find("top_left, bottom_right"), std::string::npos) << from_config;
  EXPECT_NE(message_of([] { make_call_config("bshd", "", {{"softmax", "sparse"}}); }).find("softmax"),
            std::string::npos);
  EXPECT_NE(message_of([] { make_call_config("bhsd", "", {{"q", "bf16[1,1,1,8]/[8,8,8,1]"}}); }).find("option key"),
            std::string::npos);
  EXPECT_NE(message_of([] { make_call_config("bsdh", "", {}); }).find("one of bshd, sbhd, bhsd, thd"),
            std::string::npos);
}

// make_spec hands back the proof of its validation, which get_plan takes without validating again.
static_assert(std::is_same_v<decltype(make_spec(CallConfig{}, CallShape{})), ValidatedSpec>);

TEST(MakeSpec, EqualsTheNamedLayoutsSpec) {
  const CallConfig config = make_call_config("bshd", "", {{"causal", "1"}});
  const AttentionSpec made =
      make_spec(config, shape_of(dense({2, 100, 8, 64}), dense({2, 70, 2, 64}), dense({2, 70, 2, 32}))).spec();
  AttentionSpec expected = parse_spec("layout=bshd b=2 s_q=100 s_kv=70 h_q=8 h_kv=2 d_qk=64 d_v=32 causal");
  EXPECT_EQ(made, expected) << to_string(made);
}

TEST(MakeSpec, TakesViewsOfPackedBuffersAsTheyAre) {
  // q, k, v as views into one [b, s, 3, h, d] buffer: strides of the packed layout bs3hd.
  const std::int64_t b = 2, s = 50, h = 4, d = 64;
  TensorView view = dense({b, s, h, d});
  view.strides = {s * 3 * h * d, 3 * h * d, d, 1};
  const AttentionSpec made = make_spec(make_call_config("bshd", "", {}), shape_of(view, view, view)).spec();
  ProblemShape shape{DType::bf16, b, s, s, h, h, d, d};
  const LayoutTensors packed = make_layout(Layout::bs3hd, shape);
  EXPECT_EQ(made.q, packed.q);
  EXPECT_EQ(made.k.strides, packed.k.strides);
  EXPECT_EQ(made.o, make_layout(Layout::bshd, shape).o);  // O is allocated dense
}

TEST(MakeSpec, RaggedCallsTakeSequencesAndLongestLengths) {
  CallShape shape = shape_of(dense({300, 8, 64}), dense({300, 8, 64}), dense({300, 8, 64}));
  shape.sequences = 3;
  shape.max_seq_q = shape.max_seq_kv = 150;
  const AttentionSpec made =
      make_spec(make_call_config("thd", "", {{"padding", "1"}, {"causal", "1"}}), shape).spec();
  EXPECT_TRUE(made.ragged_q());
  EXPECT_EQ(made.batch(), 3);
  EXPECT_EQ(made.seq_q(), 150);
  EXPECT_EQ(made.q.strides, (std::array<std::int64_t, 4>{0, 64, 512, 1}));
  shape.sequences = 0;
  EXPECT_NE(message_of([&] { make_spec(make_call_config("thd", "", {{"padding", "1"}}), shape); }).find("sequences"),
            std::string::npos);
}

TEST(MakeSpec, BadTensorsGetValidatesMessages) {
  const CallConfig config = make_call_config("bshd", "", {});
  // h_q = 6 with h_kv = 4: the core's GQA message, as `fusedattn run` prints it for the same sizes.
  const std::string gqa =
      message_of([&] { make_spec(config, shape_of(dense({1, 16, 6, 64}), dense({1, 16, 4, 64}), dense({1, 16, 4, 64}))); });
  const std::string cli = message_of([] { validate(parse_spec("layout=bshd b=1 s=16 h_q=6 h_kv=4 d=64")); });
  EXPECT_EQ(gqa, cli);
  EXPECT_NE(message_of([&] { make_spec(config, shape_of(dense({1, 16, 4}), dense({1, 16, 4, 64}), dense({1, 16, 4, 64}))); })
                .find("q.shape"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              make_spec(config,
                        shape_of(dense({1, 16, 4, 64}), dense({1, 16, 4, 64}, DType::f16), dense({1, 16, 4, 64})));
            }).find("k.dtype"),
            std::string::npos);
}

TEST(BiasKind, FollowsWhichDimsBroadcast) {
  const CallConfig config = make_call_config("bshd", "", {});
  const CallShape shape = shape_of(dense({2, 10, 4, 64}), dense({2, 12, 4, 64}), dense({2, 12, 4, 64}));
  EXPECT_EQ(bias_kind(dense({2, 4, 10, 12}), config, shape), Bias::bhss);
  EXPECT_EQ(bias_kind(dense({2, 1, 10, 12}), config, shape), Bias::b1ss);
  EXPECT_EQ(bias_kind(dense({1, 4, 10, 12}), config, shape), Bias::one_hss);
  EXPECT_EQ(bias_kind(dense({1, 1, 10, 12}), config, shape), Bias::one_1ss);
  EXPECT_EQ(bias_kind(dense({1, 1, 1, 12}), config, shape), Bias::one_11s);
  const std::string wrong = message_of([&] { bias_kind(dense({2, 4, 10, 11}), config, shape); });
  EXPECT_NE(wrong.find("bias.shape = [2,4,10,11]"), std::string::npos) << wrong;
  // A batch or head axis over one broadcast query row: the message names the shapes that are taken,
  // with this call's sizes, and the one given is not among them.
  const std::string row = message_of([&] { bias_kind(dense({2, 4, 1, 12}), config, shape); });
  EXPECT_NE(row.find("bias.shape = [2,4,1,12]"), std::string::npos) << row;
  EXPECT_NE(row.find("one of [2,4,10,12], [2,1,10,12], [1,4,10,12], [1,1,10,12], [1,1,1,12]"), std::string::npos)
      << row;
  EXPECT_EQ(row.find("[2,4,1,12]", row.find("one of")), std::string::npos) << row;
  EXPECT_NE(message_of([&] { bias_kind(dense({2, 4, 10, 12}, DType::f16), config, shape); }).find("bias.dtype"),
            std::string::npos);
  // Ragged: the batch and lengths are the call's sequences and longest lengths.
  CallShape ragged = shape_of(dense({300, 4, 64}), dense({300, 4, 64}), dense({300, 4, 64}));
  ragged.sequences = 3;
  ragged.max_seq_q = ragged.max_seq_kv = 128;
  EXPECT_EQ(bias_kind(dense({3, 4, 128, 128}), make_call_config("thd", "", {}), ragged), Bias::bhss);
}

TEST(BiasKind, ADecodeStepsQueryRowIsTheWholeAxis) {
  // s_q = 1: a bias of one query row is that row, per entry and per head, not a broadcast row
  // (a decode step's padding mask [b, 1, 1, s_kv], or one per head).
  const CallConfig config = make_call_config("bhsd", "", {});
  const CallShape shape = shape_of(dense({3, 8, 1, 64}), dense({3, 2, 40, 64}), dense({3, 2, 40, 64}));
  EXPECT_EQ(bias_kind(dense({3, 1, 1, 40}), config, shape), Bias::b1ss);
  EXPECT_EQ(bias_kind(dense({3, 8, 1, 40}), config, shape), Bias::bhss);
  EXPECT_EQ(bias_kind(dense({1, 8, 1, 40}), config, shape), Bias::one_hss);
  EXPECT_EQ(bias_kind(dense({1, 1, 1, 40}), config, shape), Bias::one_11s);
  // The spec it makes describes the bias as given: [b, 1, 1, s_kv] with its own strides.
  CallConfig biased = config;
  biased.options.bias = bias_kind(dense({3, 1, 1, 40}), config, shape);
  const AttentionSpec spec = make_spec(biased, shape).spec();
  EXPECT_EQ(spec.bias, Bias::b1ss);
  EXPECT_EQ(bias_desc(spec).dims, (std::array<std::int64_t, 4>{3, 1, 1, 40}));
  // Still refused: a wrong key length, in the same words as at any s_q.
  const std::string wrong = message_of([&] { bias_kind(dense({3, 1, 1, 41}), config, shape); });
  EXPECT_NE(wrong.find("bias.shape = [3,1,1,41]"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("[3|1, 8|1, 1|1, 40]"), std::string::npos) << wrong;
}

TEST(ConfigRegistry, OneIdPerDistinctConfig) {
  const CallConfig a = make_call_config("bshd", "", {{"causal", "1"}});
  const CallConfig b = make_call_config("bshd", "", {{"window", "-1,0"}});
  const CallConfig c = make_call_config("sbhd", "", {{"causal", "1"}});
  EXPECT_EQ(register_config(a), register_config(b));
  EXPECT_NE(register_config(a), register_config(c));
  EXPECT_EQ(registered_config(register_config(c)), c);
  EXPECT_THROW(registered_config(-1), InvalidArgument);
  EXPECT_THROW(registered_config(kMaxRegisteredConfigs), InvalidArgument);
}

}  // namespace
}  // namespace fusedattn
