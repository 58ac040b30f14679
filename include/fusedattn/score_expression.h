// fusedattn/score_expression.h — what the adapters trace a score function into before it becomes a
// modifier: any expression of the score-modifier grammar (fusedattn/score_mod.h), gathers included,
// and its split into the terms cuDNN's score graph runs (the modifier) and the terms that gather
// (the call's bias, which the adapters evaluate densely with their framework's operations, so that
// the framework's autodiff carries cuDNN's dBias back into the gathered tables).
//
//   const ScoreExpression traced = parse_score_expression("add(mul($0,tanh(div(score,$0))),G1(h,kv))");
//   const GatheredTerms terms = split_gathered_terms(traced);
//   terms.rest == "mul($0,tanh(div(score,$0)))" and terms.gathered == "G1(h,kv)"
#pragma once

#include <string>
#include <vector>

#include "fusedattn/score_mod.h"

namespace fusedattn {

/// An expression as a traced function writes it: gathers allowed, slots as they come (a tracer's
/// numbers and tensors that the result does not use leave gaps) and not held to a modifier's
/// limits. Empty means none. Immutable value type.
class ScoreExpression {
 public:
  ScoreExpression() = default;
  bool empty() const noexcept { return nodes_.empty(); }
  /// Post-order: every node after its arguments, the root last.
  const std::vector<ScoreModNode>& nodes() const noexcept { return nodes_; }

 private:
  friend ScoreExpression parse_score_expression(const std::string& text);
  std::vector<ScoreModNode> nodes_;
};

/// Parses the text form, gathers included; "" gives the empty expression. Throws InvalidArgument
/// naming field "score_mod" as parse_score_mod does.
ScoreExpression parse_score_expression(const std::string& text);

/// The text form (parses back to the same tree); "" for the empty one.
std::string to_string(const ScoreExpression& expression);

/// An expression's root sum (add, sub and neg flattened into terms with signs) parted by whether a
/// term gathers, each part summed again in its terms' order (a first term of sign - under neg, the
/// others added or subtracted). Without a gathering term the expression stays as it is, in `rest`.
struct GatheredTerms {
  std::string rest;      ///< the terms without a gather: what cuDNN's score graph runs; "" when none
  std::string gathered;  ///< the terms with one: the call's bias; "" when none
  /// The first gathering term that also reads the score, which no bias can hold; "" when none.
  std::string gathered_with_score;
};
GatheredTerms split_gathered_terms(const ScoreExpression& expression);

}  // namespace fusedattn
