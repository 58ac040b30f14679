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

  ScoreModLowering(const AttentionSpec& spec, ScoreModInputs inputs) : spec_(spec), inputs_(std::move(inputs)) {}

  /// The modified score of `score` (the scaled QK^T), masked by the spec's window and padding.
  TensorPtr forward(Graph& graph, const TensorPtr& score);
  /// dS with respect to the scaled score, from `d_modified`, dS with respect to the modified one.
  TensorPtr backward(Graph& graph, const TensorPtr& d_modified);

 private:
  enum class Kind { integer, boolean, real };  // int32 indices, comparisons, float32 values
  struct Value {
    Kind kind = Kind::real;
    TensorPtr tensor;       // null for a constant, made at each use in the type that use needs
    double constant = 0.0;  // a constant's value
  };

  Value lower_node(Graph& graph, std::size_t i, const TensorPtr& score);
  TensorPtr as(Graph& graph, const Value& value, Kind kind);
  TensorPtr pointwise(Graph& graph, cudnn_frontend::PointwiseMode_t mode, std::vector<TensorPtr> in, Kind compute,
                      Kind out);
  TensorPtr constant(double value, Kind kind) const;
  TensorPtr visible(Graph& graph, const TensorPtr& score);
  std::string next_name(const char* what);

  AttentionSpec spec_;
  ScoreModInputs inputs_;
  std::vector<Value> values_;  // the forward's node values, in the expression's post-order
  TensorPtr keep_;             // which scores the masks keep (boolean), or null without masks
  int names_ = 0;
};

}  // namespace fusedattn::graph
