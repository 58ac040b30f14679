// Traced score expressions (fusedattn/score_expression.h): parsed and printed by the grammar's one
// parser and printer (score_mod_text.cpp), and their gathering terms parted from the rest.
#include "fusedattn/score_expression.h"

#include <cstdint>

#include "spec/score_mod_text.h"

namespace fusedattn {
namespace {

using Nodes = std::vector<ScoreModNode>;

struct Term {
  bool negated = false;
  std::int32_t node = 0;
};

std::int32_t argument(const Nodes& nodes, std::int32_t node, int which) {
  return nodes[static_cast<std::size_t>(node)].args[static_cast<std::size_t>(which)];
}

// The root's sum: add, sub and neg flattened, left to right.
void collect_terms(const Nodes& nodes, std::int32_t node, bool negated, std::vector<Term>& out) {
  const ScoreOp op = nodes[static_cast<std::size_t>(node)].op;
  if (op == ScoreOp::add || op == ScoreOp::sub) {
    collect_terms(nodes, argument(nodes, node, 0), negated, out);
    collect_terms(nodes, argument(nodes, node, 1), op == ScoreOp::add ? negated : !negated, out);
  } else if (op == ScoreOp::neg) {
    collect_terms(nodes, argument(nodes, node, 0), !negated, out);
  } else {
    out.push_back({negated, node});
  }
}

bool reads(const Nodes& nodes, std::int32_t node, ScoreOp wanted) {
  const ScoreModNode& n = nodes[static_cast<std::size_t>(node)];
  if (n.op == wanted) return true;
  for (int i = 0; i < detail::argument_count(n); ++i) {
    if (reads(nodes, n.args[static_cast<std::size_t>(i)], wanted)) return true;
  }
  return false;
}

std::string text_of(const Nodes& nodes, std::int32_t node) {
  std::string out;
  detail::print_score_node(nodes, node, out);
  return out;
}

std::string summed(const Nodes& nodes, const std::vector<Term>& terms) {
  std::string out;
  for (const Term& term : terms) {
    const std::string text = text_of(nodes, term.node);
    if (out.empty()) {
      out = term.negated ? "neg(" + text + ")" : text;
    } else {
      out = (term.negated ? "sub(" : "add(") + out + "," + text + ")";
    }
  }
  return out;
}

}  // namespace

ScoreExpression parse_score_expression(const std::string& text) {
  ScoreExpression expression;
  if (!text.empty()) expression.nodes_ = detail::parse_score_nodes(text, detail::ScoreGrammar::expression);
  return expression;
}

std::string to_string(const ScoreExpression& expression) {
  const Nodes& nodes = expression.nodes();
  return nodes.empty() ? std::string() : text_of(nodes, static_cast<std::int32_t>(nodes.size() - 1));
}

GatheredTerms split_gathered_terms(const ScoreExpression& expression) {
  const Nodes& nodes = expression.nodes();
  GatheredTerms out;
  if (nodes.empty()) return out;
  const auto root = static_cast<std::int32_t>(nodes.size() - 1);
  if (!reads(nodes, root, ScoreOp::gather)) {
    out.rest = text_of(nodes, root);
    return out;
  }
  std::vector<Term> terms, gathered, rest;
  collect_terms(nodes, root, false, terms);
  for (const Term& term : terms) {
    const bool gathers = reads(nodes, term.node, ScoreOp::gather);
    (gathers ? gathered : rest).push_back(term);
    if (gathers && out.gathered_with_score.empty() && reads(nodes, term.node, ScoreOp::score)) {
      out.gathered_with_score = text_of(nodes, term.node);
    }
  }
  out.rest = summed(nodes, rest);
  out.gathered = summed(nodes, gathered);
  return out;
}

}  // namespace fusedattn
