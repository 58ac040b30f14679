// fusedattn._core's score-expression part: what the adapters' tracing of a score function needs of
// the grammar, which lives in C++ only (fusedattn/score_expression.h): the split of a traced
// expression into the modifier and the bias's terms, and an expression's tree, which the adapters
// evaluate with their framework's operations on index grids (the bias, densely).
#include "score_mod_bindings.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fusedattn/score_expression.h"

namespace nb = nanobind;
namespace fa = fusedattn;
using namespace nb::literals;

namespace fusedattn::python {
namespace {

std::string axes_text(std::uint8_t axes) {
  static const char* const kNames[4] = {"b", "h", "q", "kv"};
  std::string out;
  for (int axis = 0; axis < 4; ++axis) {
    if (axes & (1u << axis)) out += (out.empty() ? "" : ",") + std::string(kNames[axis]);
  }
  return out;
}

// Tuples all the way down, so that compiled Python code (torch.compile) can hold a tree as a constant.
nb::object tree_of(const std::vector<fa::ScoreModNode>& nodes, std::int32_t at) {
  const fa::ScoreModNode& node = nodes[static_cast<std::size_t>(at)];
  switch (node.op) {
    case fa::ScoreOp::constant: return nb::make_tuple("constant", node.value);
    case fa::ScoreOp::scalar: return nb::make_tuple("scalar", node.slot);
    case fa::ScoreOp::tensor: return nb::make_tuple("tensor", node.slot, axes_text(node.axes));
    case fa::ScoreOp::score: case fa::ScoreOp::batch: case fa::ScoreOp::head: case fa::ScoreOp::q_index:
    case fa::ScoreOp::kv_index:
      return nb::make_tuple(fa::to_string(node.op));
    default: break;
  }
  nb::list args;
  for (std::int32_t arg : node.args) {
    if (arg >= 0) args.append(tree_of(nodes, arg));
  }
  if (node.op == fa::ScoreOp::gather) return nb::make_tuple("gather", node.slot, nb::tuple(args));
  return nb::make_tuple(fa::to_string(node.op), nb::tuple(args));
}

}  // namespace

void bind_score_expressions(nb::module_& m) {
  nb::class_<fa::GatheredTerms>(m, "GatheredTerms",
                                "A traced expression's root sum parted: the terms without a gather (rest), those "
                                "with one (gathered), and the first gathering term that reads the score; \"\" for none.")
      .def_ro("rest", &fa::GatheredTerms::rest)
      .def_ro("gathered", &fa::GatheredTerms::gathered)
      .def_ro("gathered_with_score", &fa::GatheredTerms::gathered_with_score);
  m.def(
      "split_gathered_terms",
      [](const std::string& text) { return fa::split_gathered_terms(fa::parse_score_expression(text)); }, "text"_a,
      "The GatheredTerms of an expression's text (gathers G<n>(...) allowed); the text stays whole in rest "
      "when nothing gathers.");
  m.def(
      "score_expression_tree",
      [](const std::string& text) -> nb::object {
        const fa::ScoreExpression expression = fa::parse_score_expression(text);
        if (expression.empty()) return nb::none();
        return tree_of(expression.nodes(), static_cast<std::int32_t>(expression.nodes().size() - 1));
      },
      "text"_a,
      "An expression's tree: (\"constant\", value), (\"scalar\", slot), (\"tensor\", slot, \"h,kv\"), the leaves "
      "(\"score\",) (\"b\",) (\"h\",) (\"q\",) (\"kv\",), (\"gather\", slot, (index, ...)) and (operation, "
      "(argument, ...)) with the text's operation names (add, not, select, ...); None for \"\".");
}

}  // namespace fusedattn::python
