// Tier 1: each output's shape in the caller's axis order (fusedattn/output_shapes.h) — dense and
// ragged statistics, both max logits, GQA, d_qk != d_v, the gradients' shapes and the rank check;
// and the picks beneath them, which the Python adapters apply to symbolic sizes.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/output_shapes.h"

namespace fusedattn {
namespace {

using Sizes = std::vector<std::int64_t>;

TensorView view(Sizes sizes) {
  TensorView out;
  out.rank = static_cast<int>(sizes.size());
  for (int i = 0; i < out.rank; ++i) out.sizes[i] = sizes[i];
  return out;
}

std::map<std::string, Sizes> shapes(const CallConfig& config, Sizes q, Sizes k, Sizes v, Pass pass) {
  CallShape shape;
  shape.q = view(q);
  shape.k = view(k);
  shape.v = view(v);
  std::map<std::string, Sizes> out;
  for (const OutputShape& o : output_shapes(config, shape, pass)) out[o.name] = o.sizes;
  return out;
}

CallConfig config(const char* layout, std::vector<std::pair<std::string, std::string>> options = {}) {
  return make_call_config(layout, "", options);
}

// GQA (8 query heads over 2) with d_qk 128 and d_v 64, in each dense order: O takes v's head dim,
// the statistics [b, h_q, s_q] whatever the order.
TEST(OutputShapes, DenseGqaWithNarrowerV) {
  auto bshd = shapes(config("bshd", {{"stats", "1"}}), {2, 100, 8, 128}, {2, 50, 2, 128}, {2, 50, 2, 64},
                     Pass::forward);
  EXPECT_EQ(bshd.at("o"), (Sizes{2, 100, 8, 64}));
  EXPECT_EQ(bshd.at("stats"), (Sizes{2, 8, 100}));
  EXPECT_EQ(bshd.count("max_logit"), 0u);
  auto sbhd = shapes(config("sbhd", {{"stats", "1"}}), {100, 2, 8, 128}, {50, 2, 2, 128}, {50, 2, 2, 64},
                     Pass::forward);
  EXPECT_EQ(sbhd.at("o"), (Sizes{100, 2, 8, 64}));
  EXPECT_EQ(sbhd.at("stats"), (Sizes{2, 8, 100}));
  auto bhsd = shapes(config("bhsd", {{"stats", "1"}}), {2, 8, 100, 128}, {2, 2, 50, 128}, {2, 2, 50, 64},
                     Pass::forward);
  EXPECT_EQ(bhsd.at("o"), (Sizes{2, 8, 100, 64}));
  EXPECT_EQ(bhsd.at("stats"), (Sizes{2, 8, 100}));
}

TEST(OutputShapes, NoStatsWithoutTraining) {
  auto out = shapes(config("bshd", {{"stats", "0"}}), {2, 100, 8, 64}, {2, 100, 8, 64}, {2, 100, 8, 64},
                    Pass::forward);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(out.at("o"), (Sizes{2, 100, 8, 64}));
}

TEST(OutputShapes, RaggedByToken) {
  auto out = shapes(config("thd", {{"stats", "1"}, {"max_logit", "row"}}), {300, 8, 128}, {280, 2, 128},
                    {280, 2, 64}, Pass::forward);
  EXPECT_EQ(out.at("o"), (Sizes{300, 8, 64}));
  EXPECT_EQ(out.at("stats"), (Sizes{300, 8}));
  EXPECT_EQ(out.at("max_logit"), (Sizes{300, 8}));
}

TEST(OutputShapes, MaxLogitPerRowAndPerHead) {
  auto row = shapes(config("sbhd", {{"max_logit", "row"}}), {100, 2, 8, 64}, {50, 2, 2, 64}, {50, 2, 2, 64},
                    Pass::forward);
  EXPECT_EQ(row.at("max_logit"), (Sizes{2, 8, 100}));
  auto head = shapes(config("bhsd", {{"max_logit", "head"}}), {2, 8, 100, 64}, {2, 2, 50, 64}, {2, 2, 50, 64},
                     Pass::forward);
  EXPECT_EQ(head.at("max_logit"), (Sizes{8}));
  auto ragged = shapes(config("thd", {{"max_logit", "head"}}), {300, 8, 64}, {280, 2, 64}, {280, 2, 64},
                       Pass::forward);
  EXPECT_EQ(ragged.at("max_logit"), (Sizes{8}));
}

// Gradients keep their inputs' shapes (GQA's dK, dV have h_kv heads); d_sink is per query head.
TEST(OutputShapes, GradientsAreTheirInputsShapes) {
  auto out = shapes(config("bshd", {{"softmax", "sink"}}), {2, 100, 8, 128}, {2, 50, 2, 128}, {2, 50, 2, 64},
                    Pass::backward);
  EXPECT_EQ(out.at("d_q"), (Sizes{2, 100, 8, 128}));
  EXPECT_EQ(out.at("d_k"), (Sizes{2, 50, 2, 128}));
  EXPECT_EQ(out.at("d_v"), (Sizes{2, 50, 2, 64}));
  EXPECT_EQ(out.at("d_sink"), (Sizes{8}));
  EXPECT_EQ(out.count("o"), 0u);
}

// The picks name input axes: sbhd's statistics take q's axes 1 (b), 2 (h) and 0 (s); O's last axis
// is v's head dim, whatever q's is.
TEST(OutputShapes, PicksNameInputAxes) {
  const std::vector<OutputAxes> axes = output_axes(config("sbhd", {{"stats", "1"}}), Pass::forward);
  ASSERT_EQ(axes.size(), 2u);
  EXPECT_EQ(axes[0].name, "o");
  ASSERT_EQ(axes[0].axes.size(), 4u);
  EXPECT_EQ(axes[0].axes[3].input, AxisPick::Input::v);
  EXPECT_EQ(axes[0].axes[3].axis, 3);
  EXPECT_EQ(axes[1].name, "stats");
  ASSERT_EQ(axes[1].axes.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(axes[1].axes[i].input, AxisPick::Input::q);
  EXPECT_EQ(axes[1].axes[0].axis, 1);
  EXPECT_EQ(axes[1].axes[1].axis, 2);
  EXPECT_EQ(axes[1].axes[2].axis, 0);
  // A ragged q beside a dense (paged-style) kv: O's head dim is v's axis 3, not 2.
  const std::vector<OutputAxes> mixed = output_axes(make_call_config("thd", "bshd", {}), Pass::forward);
  EXPECT_EQ(mixed[0].axes.size(), 3u);
  EXPECT_EQ(mixed[0].axes[2].axis, 3);
}

TEST(OutputShapes, RankMustBeTheLayouts) {
  CallShape shape;
  shape.q = view({300, 8, 64});
  shape.k = shape.v = view({2, 100, 8, 64});
  try {
    output_shapes(config("bshd"), shape, Pass::forward);
    FAIL() << "a 3-dim q passed as bshd";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("q.shape"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace fusedattn
