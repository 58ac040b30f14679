// The score_mod lowering's shape, without a GPU: the operations it emits for each kind of
// expression keep the rules cuDNN 9.19's fused kernels were measured to need on the H200 (every
// operation's first input virtual, no logical and/or/not; the GPU tier's ScoreModNumerics runs them), and
// what each costs, in operations, as worked numbers.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <cudnn_frontend.h>

#include "fusedattn/spec.h"
#include "graph/score_mod_lowering.h"

namespace fusedattn::graph {
namespace {

namespace fe = cudnn_frontend;
using Emitted = ScoreModLowering::Emitted;
using Mode = ScoreModLowering::Mode;

struct Lowered {
  std::vector<Emitted> forward, backward;
};

std::shared_ptr<fe::graph::Tensor_attributes> virtual_scores(const AttentionSpec& spec) {
  auto t = std::make_shared<fe::graph::Tensor_attributes>();
  t->set_is_virtual(true).set_dim({spec.batch(), spec.heads_q(), spec.seq_q(), spec.seq_kv()}).set_data_type(
      fe::DataType_t::FLOAT);
  return t;
}

// The forward and the backward callbacks of `spec`'s modifier, with its scalars, tensors and
// lengths as the graph's inputs (non-virtual, as sdpa_graph.cpp makes them).
Lowered lower(const std::string& text) {
  const AttentionSpec spec = parse_spec(text);
  fe::graph::Graph graph;
  ScoreModInputs inputs;
  auto input = [&](std::vector<std::int64_t> dims, fe::DataType_t type) {
    return graph.tensor(fe::graph::Tensor_attributes().set_dim(dims).set_stride({0, 0, 0, 1}).set_data_type(type));
  };
  for (int i = 0; i < spec.score_mod.scalars(); ++i) inputs.scalars.push_back(input({1, 1, 1, 1}, fe::DataType_t::FLOAT));
  for (int i = 0; i < spec.score_mod.tensors(); ++i) inputs.tensors.push_back(input({1, 1, 1, 1}, fe::DataType_t::FLOAT));
  if (spec.padding) {
    inputs.seq_len_q = input({spec.batch(), 1, 1, 1}, fe::DataType_t::INT32);
    inputs.seq_len_kv = input({spec.batch(), 1, 1, 1}, fe::DataType_t::INT32);
  }
  ScoreModLowering lowering(spec, inputs);
  Lowered out;
  lowering.forward(graph, virtual_scores(spec));
  out.forward = lowering.emitted();
  lowering.backward(graph, virtual_scores(spec));
  out.backward.assign(lowering.emitted().begin() + static_cast<std::ptrdiff_t>(out.forward.size()),
                      lowering.emitted().end());
  return out;
}

void expect_cudnn_rules(const std::vector<Emitted>& ops, const std::string& what) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    EXPECT_TRUE(ops[i].first_input_virtual) << what << ": operation " << i << " has a non-virtual first input";
    EXPECT_NE(ops[i].mode, Mode::LOGICAL_AND) << what;
    EXPECT_NE(ops[i].mode, Mode::LOGICAL_OR) << what;
    EXPECT_NE(ops[i].mode, Mode::LOGICAL_NOT) << what;
    EXPECT_FALSE(ops[i].adds_keys_broadcast) << what << ": operation " << i << " adds a tensor broadcast over the keys";
  }
}

constexpr const char* kBase = "layout=bshd b=2 s=256 h=4 d=64";

TEST(ScoreModLowering, EveryExpressionKeepsCudnnsRules) {
  const char* expressions[] = {
      "mul(tanh(div(score,$0)),$0)", "mul($0,tanh(div(score,$0)))", "add(score,mul(t0[h],sub(kv,q)))",
      "select(or(le(kv,q),lt(kv,$0)),score,-inf)", "select(and(le(kv,q),gt(kv,sub(q,64))),score,-inf)",
      "mul(score,exp(neg(abs(div(sub(kv,q),64)))))", "sub(score,log(add(abs(sub(kv,q)),1)))",
      "sub(score,sqrt(abs(sub(kv,q))))", "mul(score,sigmoid(score))", "sub(score,mul(0.1,pow(score,2)))",
      "max(min(score,$0),neg($0))", "div(score,add(abs(sub(kv,q)),1))", "mul(score,div(1,add(abs(sub(kv,q)),1)))",
      "select(gt(score,0),score,mul(score,0.25))", "neg(sub($0,score))", "select(or(eq(kv,q),ne(h,1)),score,sub(score,1))",
      "select(not(ge(q,kv)),sub(score,2),score)", "add(score,mul(lt(kv,q),$0))", "abs(score)", "add(mul(score,score),score)",
      "mul(score,add(t0[b],2))", "add(score,mul(0.05,pow(score,3)))", "pow(score,$0)", "sub($0,$1)",
      "select(1,score,$0)", "select(lt(kv,q),$0,$1)",
      // index arithmetic: blocks (//), remainders (%), casts toward zero, signs
      "select(eq(floor(div(q,$0)),floor(div(kv,$0))),score,-inf)", "add(score,sub(kv,mul(floor(div(kv,$0)),$0)))",
      "add(score,trunc(div(score,$0)))", "add(score,mul(sign(sub(kv,q)),$0))", "add(score,ceil(div(sub(kv,q),3)))",
  };
  for (const char* masks : {"", " causal", " window=64,16 align=bottom_right s_kv=300", " padding=1 causal",
                            " padding=1 causal align=bottom_right s_kv=300", " padding=1 window=64,16 align=bottom_right"}) {
    for (const char* mod : expressions) {
      const std::string text = std::string(kBase) + masks + " score_mod=" + mod;
      const Lowered lowered = lower(text);
      expect_cudnn_rules(lowered.forward, text + " (forward)");
      expect_cudnn_rules(lowered.backward, text + " (backward)");
    }
  }
}

TEST(ScoreModLowering, WorkedOperationCounts) {
  // Softcap: DIV, TANH, MUL forward; backward a*$0, a - (a t) t (3), the division's a / $0: 5.
  const Lowered softcap = lower(std::string(kBase) + " score_mod=mul(tanh(div(score,$0)),$0)");
  EXPECT_EQ(softcap.forward.size(), 3u);
  EXPECT_EQ(softcap.backward.size(), 5u);
  // Causal with fixed lengths is the frontend's own diagonal band mask (its operations are the
  // frontend's, not emitted here): the forward stays 3; the backward masks dS again only where a
  // derivative can overflow, which a softcap's cannot.
  const Lowered causal = lower(std::string(kBase) + " causal score_mod=mul(tanh(div(score,$0)),$0)");
  EXPECT_EQ(causal.forward.size(), 3u);
  EXPECT_EQ(causal.backward.size(), 5u);
  // With runtime lengths the window is ours: the row and column indices, j - i, the comparison and
  // the select (5), and the padding's two comparisons and two selects: 12 forward.
  const Lowered padded = lower(std::string(kBase) + " padding=1 causal score_mod=mul(tanh(div(score,$0)),$0)");
  EXPECT_EQ(padded.forward.size(), 12u);
  // Bottom-right, each entry's shift from its lengths: (j - len_kv) - (i - len_q), two operations more.
  const Lowered shifted =
      lower(std::string(kBase) + " padding=1 causal align=bottom_right s_kv=300 score_mod=mul(tanh(div(score,$0)),$0)");
  EXPECT_EQ(shifted.forward.size(), 14u);
  // A tensor by batch is broadcast over the keys: t0 + 2 made virtual as 0 - (0 - t0) + 2, not 0 + t0.
  const Lowered by_batch = lower(std::string(kBase) + " score_mod=mul(score,add(t0[b],2))");
  EXPECT_EQ(by_batch.forward.size(), 5u);  // 0 * score, 0 - t0, 0 - that, + 2, * score
  // A log of a distance can overflow: the window stays conditions (measured that way), and dS gets
  // one select.
  const Lowered logged = lower(std::string(kBase) + " causal score_mod=sub(score,log(add(abs(sub(kv,q)),1)))");
  EXPECT_EQ(logged.backward.size(), 1u);  // the select; the log carries no derivative to the score
  EXPECT_EQ(logged.backward[0].mode, Mode::BINARY_SELECT);
  // Constants fold: sub($0, $1) is an operation on scalars alone, made virtual first (0 * score + $0).
  const Lowered scalars = lower(std::string(kBase) + " score_mod=add(score,sub(2,3))");
  EXPECT_EQ(scalars.forward.size(), 1u);  // score + (-1)
  // No logic operation ever: and(a, b) ? x : y is a ? (b ? x : y) : y, two selects.
  const Lowered window = lower(std::string(kBase) + " score_mod=select(and(le(kv,q),gt(kv,sub(q,64))),score,-inf)");
  int selects = 0;
  for (const Emitted& op : window.forward) selects += op.mode == Mode::BINARY_SELECT;
  EXPECT_EQ(selects, 2);
  // An index is its own floor, ceil and truncation: no operation for them.
  const Lowered same_index = lower(std::string(kBase) + " score_mod=select(eq(floor(q),trunc(kv)),score,-inf)");
  for (const Emitted& op : same_index.forward) {
    EXPECT_NE(op.mode, Mode::FLOOR);
    EXPECT_NE(op.mode, Mode::CEIL);
  }
  // A real's truncation: the comparison, CEIL, FLOOR and their select (4) on one value.
  const Lowered truncated = lower(std::string(kBase) + " score_mod=add(score,trunc(div(score,$0)))");
  int floors = 0, ceils = 0;
  for (const Emitted& op : truncated.forward) {
    floors += op.mode == Mode::FLOOR;
    ceils += op.mode == Mode::CEIL;
  }
  EXPECT_EQ(floors, 1);
  EXPECT_EQ(ceils, 1);
}

}  // namespace
}  // namespace fusedattn::graph
