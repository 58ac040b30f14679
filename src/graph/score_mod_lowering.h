// A score modifier (fusedattn/score_mod.h) as frontend pointwise operations: the forward
// callback that modifies each scaled score and then writes in the masks cuDNN switches off beside
// a modifier, and the backward callback, the expression's reverse-mode derivative applied to dS.
//
// Internal to the graph layer (the frontend headers stay below it).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cudnn_frontend.h>

#include "fusedattn/spec.h"

namespace fusedattn::graph {

/// The graph's tensors a modifier reads: its runtime scalars (float32 [1, 1, 1, 1] each, device
/// memory), its tensors (float32, broadcast over the axes they lack), and the runtime lengths
/// where the spec has padding (int32 [b, 1, 1, 1]), for the padding mask written in.
struct ScoreModInputs {
  std::vector<std::shared_ptr<cudnn_frontend::graph::Tensor_attributes>> scalars, tensors;
  std::shared_ptr<cudnn_frontend::graph::Tensor_attributes> seq_len_q, seq_len_kv;
};

/// One lowering per graph: forward() runs first (in the backward graph too, where cuDNN recomputes
/// the scores) and keeps every node's tensor, which backward() then reads.
class ScoreModLowering {
 public:
  using Graph = cudnn_frontend::graph::Graph;
  using TensorPtr = std::shared_ptr<cudnn_frontend::graph::Tensor_attributes>;
  using Mode = cudnn_frontend::PointwiseMode_t;

  ScoreModLowering(const AttentionSpec& spec, ScoreModInputs inputs) : spec_(spec), inputs_(std::move(inputs)) {}

  /// The modified score of `score` (the scaled QK^T), masked by the spec's window and padding.
  TensorPtr forward(Graph& graph, const TensorPtr& score);
  /// dS with respect to the scaled score, from `d_modified`, dS with respect to the modified one.
  TensorPtr backward(Graph& graph, const TensorPtr& d_modified);

  /// Every operation emitted so far, in order, with whether its first input is virtual (cuDNN
  /// 9.19's rule) and whether it adds a tensor of the call broadcast over the keys (cuDNN 9.26's),
  /// for the tests of the lowering's shape.
  struct Emitted {
    Mode mode;
    bool first_input_virtual;
    bool adds_keys_broadcast = false;
  };
  const std::vector<Emitted>& emitted() const noexcept { return emitted_; }

 private:
  // int32 (indices, integer arithmetic on them), a condition (comparisons and logic, lowered
  // into selects where used) or float32.
  enum class Kind { integer, condition, real };
  struct Value {
    Kind kind = Kind::real;
    TensorPtr tensor;       // null for a constant (made at each use) and for and / or / not
    double constant = 0.0;  // a constant's value
  };

  Value lower_node(std::size_t i);
  TensorPtr number(const Value& value, Kind kind, std::size_t node);
  TensorPtr select_on(std::size_t condition, TensorPtr yes, TensorPtr no);
  TensorPtr compare(Mode mode, std::size_t node);
  TensorPtr emit(Mode mode, std::vector<TensorPtr> in, Kind compute, Kind out);
  TensorPtr real(Mode mode, std::vector<TensorPtr> in) { return emit(mode, std::move(in), Kind::real, Kind::real); }
  TensorPtr materialized(const TensorPtr& tensor);
  TensorPtr zero();
  static bool broadcast_over_keys(const TensorPtr& tensor);
  TensorPtr index(int axis);
  static bool small_power(const Value& exponent);
  TensorPtr product(const TensorPtr& x, int n);
  TensorPtr value_of(std::int32_t node);
  std::vector<TensorPtr> visibility();  // the window and padding as conditions keeping the visible scores
  bool window_as_band() const noexcept;
  TensorPtr band_mask(TensorPtr modified);

  AttentionSpec spec_;
  ScoreModInputs inputs_;
  Graph* graph_ = nullptr;     // the subgraph being built (forward or backward callback)
  TensorPtr anchor_;           // a score-shaped tensor of that subgraph (the score, or dS)
  TensorPtr zero_;             // anchor * 0, made once per subgraph where needed
  std::vector<Value> values_;  // the forward's node values, in the expression's post-order
  std::vector<TensorPtr> keep_;  // the masks' conditions (boolean), each keeping the visible scores
  int names_ = 0;
  std::vector<Emitted> emitted_;
};

/// When this file was compiled (part of graph::build_stamp()).
const char* score_mod_lowering_build_stamp() noexcept;

}  // namespace fusedattn::graph
