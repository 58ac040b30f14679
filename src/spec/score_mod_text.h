// The score-modifier grammar's one parser and one printer (fusedattn/score_mod.h has the grammar),
// shared by modifiers (score_mod.cpp) and the adapters' traced expressions (score_expression.cpp).
// Not public API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusedattn/score_mod.h"

namespace fusedattn::detail {

/// What a parse takes: a modifier's text (no gathers: cuDNN's score graph has none; at most
/// kMaxModifierNodes nodes, as a spec string stays short), or an expression of the adapters'
/// tracing (gathers included, kMaxExpressionNodes).
enum class ScoreGrammar : std::uint8_t { modifier, expression };

constexpr std::size_t kMaxModifierNodes = 256;
// A traced function's whole expression, its bias terms included; this also bounds the parser's
// recursion (a small frame per level).
constexpr std::size_t kMaxExpressionNodes = 4096;

/// The nodes of `text` in post-order (the root last); slots as written (their numbering is the
/// modifier's rule, score_mod.cpp). Throws InvalidArgument naming field "score_mod", the place it
/// stopped and what it wanted there.
std::vector<ScoreModNode> parse_score_nodes(const std::string& text, ScoreGrammar grammar);

/// The offsets shift_indices() adds to the query and key indices (0: printed as they are).
struct IndexOffsets {
  std::int64_t q = 0, kv = 0;
};

/// Appends the text of the subexpression rooted at node `at`.
void print_score_node(const std::vector<ScoreModNode>& nodes, std::int32_t at, std::string& out,
                      IndexOffsets offsets = {});

/// How many arguments node `node` has (its operation's arity; a gather's index count).
int argument_count(const ScoreModNode& node);

}  // namespace fusedattn::detail
