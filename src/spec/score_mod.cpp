// Score modifiers: the rules a modifier's slots keep, index shifts, structural hashing, and the host
// evaluator the references use (the text form's parser and printer are score_mod_text.cpp's).
#include "fusedattn/score_mod.h"

#include <cmath>
#include <functional>
#include <stdexcept>

#include "fusedattn/errors.h"
#include "spec/score_mod_text.h"
#include "spec/text.h"

namespace fusedattn {
namespace {

// Slots numbered from 0 without gaps (so that a call's count says which it passes), and one set of
// axes per tensor.
void number_slots(const std::string& text, const std::vector<ScoreModNode>& nodes, int& scalars,
                  std::vector<std::uint8_t>& tensor_axes) {
  std::vector<bool> scalar_seen, tensor_seen;
  for (const ScoreModNode& node : nodes) {
    const auto slot = static_cast<std::size_t>(node.slot);
    if (node.op == ScoreOp::scalar) {
      if (scalar_seen.size() <= slot) scalar_seen.resize(slot + 1, false);
      scalar_seen[slot] = true;
    } else if (node.op == ScoreOp::tensor) {
      if (tensor_seen.size() <= slot) {
        tensor_seen.resize(slot + 1, false);
        tensor_axes.resize(slot + 1, 0);
      }
      if (tensor_seen[slot] && tensor_axes[slot] != node.axes) {
        throw InvalidArgument("score_mod", "\"" + text + "\"", "one set of axes for t" + std::to_string(slot));
      }
      tensor_seen[slot] = true;
      tensor_axes[slot] = node.axes;
    }
  }
  for (const auto* seen : {&scalar_seen, &tensor_seen}) {
    for (std::size_t i = 0; i < seen->size(); ++i) {
      if (!(*seen)[i]) {
        const std::string name = (seen == &scalar_seen ? "$" : "t") + std::to_string(i);
        throw InvalidArgument("score_mod", "\"" + text + "\"",
                              "slots numbered from 0 without gaps (" + name + " is missing)");
      }
    }
  }
  if (scalar_seen.size() > static_cast<std::size_t>(kMaxScoreModScalars) ||
      tensor_seen.size() > static_cast<std::size_t>(kMaxScoreModTensors)) {
    throw InvalidArgument("score_mod", "\"" + text + "\"",
                          "at most " + std::to_string(kMaxScoreModScalars) + " scalars and " +
                              std::to_string(kMaxScoreModTensors) + " tensors");
  }
  scalars = static_cast<int>(scalar_seen.size());
}

// Element of tensor `slot` at the point's indices: contiguous over its axes, in b, h, q, kv order.
double tensor_element(const ScoreModNode& node, const ScoreModPoint& p) {
  std::int64_t offset = 0;
  for (int axis = 0; axis < 4; ++axis) {
    if (node.axes & (1u << axis)) offset = offset * p.sizes[static_cast<std::size_t>(axis)] + p.index[static_cast<std::size_t>(axis)];
  }
  return p.tensors[node.slot][offset];
}

}  // namespace

bool operator==(const ScoreModNode& a, const ScoreModNode& b) noexcept {
  // Constants compare by bits, so that -0.0 and 0.0 (which print apart) stay apart.
  return a.op == b.op && std::signbit(a.value) == std::signbit(b.value) && a.value == b.value && a.slot == b.slot &&
         a.axes == b.axes && a.args == b.args;
}

ScoreMod parse_score_mod(const std::string& text) {
  ScoreMod mod;
  if (text.empty()) return mod;
  mod.nodes_ = detail::parse_score_nodes(text, detail::ScoreGrammar::modifier);
  number_slots(text, mod.nodes_, mod.scalars_, mod.tensor_axes_);
  return mod;
}

ScoreMod shift_indices(const ScoreMod& mod, std::int64_t q_offset, std::int64_t kv_offset) {
  if (mod.empty()) return mod;
  std::string text;
  detail::print_score_node(mod.nodes(), static_cast<std::int32_t>(mod.nodes().size() - 1), text,
                           detail::IndexOffsets{q_offset, kv_offset});
  return parse_score_mod(text);
}

std::string to_string(const ScoreMod& mod) {
  std::string out;
  if (!mod.empty()) detail::print_score_node(mod.nodes(), static_cast<std::int32_t>(mod.nodes().size() - 1), out);
  return out;
}

std::size_t hash_value(const ScoreMod& mod) noexcept {
  std::size_t seed = mod.nodes().size();
  for (const ScoreModNode& node : mod.nodes()) {
    detail::hash_combine(seed, static_cast<std::size_t>(node.op));
    detail::hash_combine(seed, std::hash<double>{}(node.value));
    detail::hash_combine(seed, static_cast<std::size_t>(node.slot) * 16 + node.axes);
    for (std::int32_t arg : node.args) detail::hash_combine(seed, static_cast<std::size_t>(arg + 1));
  }
  return seed;
}

std::array<std::int64_t, 4> tensor_dims(const ScoreMod& mod, int slot, const std::array<std::int64_t, 4>& sizes) {
  static constexpr std::uint8_t kBits[4] = {kAxisB, kAxisH, kAxisQ, kAxisKv};
  std::array<std::int64_t, 4> dims{};
  for (int axis = 0; axis < 4; ++axis) dims[axis] = (mod.tensor_axes(slot) & kBits[axis]) ? sizes[axis] : 1;
  return dims;
}

double evaluate(const ScoreMod& mod, const ScoreModPoint& p) { return evaluate_with_derivative(mod, p).value; }

ScoreModValue evaluate_with_derivative(const ScoreMod& mod, const ScoreModPoint& p) {
  if (mod.empty()) return {p.score, 1.0};
  // A term that does not move with the score adds nothing, even where its own local derivative is
  // not finite (sqrt(|kv - q|) on the diagonal): 0 * inf would otherwise make the slope NaN. The
  // graph layer's backward leaves such terms out altogether.
  const auto chain = [](double slope, double local) { return slope == 0.0 ? 0.0 : slope * local; };
  std::vector<double> value(mod.nodes().size()), slope(mod.nodes().size());
  for (std::size_t i = 0; i < mod.nodes().size(); ++i) {
    const ScoreModNode& n = mod.nodes()[i];
    auto arg = [&](int k, const std::vector<double>& of) {
      return n.args[static_cast<std::size_t>(k)] >= 0 ? of[static_cast<std::size_t>(n.args[static_cast<std::size_t>(k)])] : 0.0;
    };
    const double x = arg(0, value), y = arg(1, value), z = arg(2, value);
    const double dx = arg(0, slope), dy = arg(1, slope), dz = arg(2, slope);
    double& v = value[i];
    double& dv = slope[i];  // stays 0 for the leaves but the score, and for comparisons and logic
    switch (n.op) {
      case ScoreOp::score: v = p.score; dv = 1.0; break;
      case ScoreOp::batch: v = static_cast<double>(p.index[0]); break;
      case ScoreOp::head: v = static_cast<double>(p.index[1]); break;
      case ScoreOp::q_index: v = static_cast<double>(p.index[2]); break;
      case ScoreOp::kv_index: v = static_cast<double>(p.index[3]); break;
      case ScoreOp::constant: v = n.value; break;
      case ScoreOp::scalar: v = p.scalars[n.slot]; break;
      case ScoreOp::tensor: v = tensor_element(n, p); break;
      case ScoreOp::neg: v = -x; dv = -dx; break;
      case ScoreOp::abs: v = std::fabs(x); dv = x > 0 ? dx : x < 0 ? -dx : 0.0; break;
      case ScoreOp::exp: v = std::exp(x); dv = chain(dx, v); break;
      case ScoreOp::log: v = std::log(x); dv = chain(dx, 1.0 / x); break;
      case ScoreOp::sqrt: v = std::sqrt(x); dv = chain(dx, 0.5 / v); break;
      case ScoreOp::tanh: v = std::tanh(x); dv = chain(dx, 1.0 - v * v); break;
      case ScoreOp::sigmoid: v = 1.0 / (1.0 + std::exp(-x)); dv = chain(dx, v * (1.0 - v)); break;
      case ScoreOp::logical_not: v = x == 0.0 ? 1.0 : 0.0; break;
      case ScoreOp::floor: v = std::floor(x); break;  // flat between the steps: no slope
      case ScoreOp::ceil: v = std::ceil(x); break;
      case ScoreOp::trunc: v = std::trunc(x); break;
      case ScoreOp::sign: v = x > 0.0 ? 1.0 : x < 0.0 ? -1.0 : 0.0; break;
      case ScoreOp::add: v = x + y; dv = dx + dy; break;
      case ScoreOp::sub: v = x - y; dv = dx - dy; break;
      case ScoreOp::mul: v = x * y; dv = chain(dx, y) + chain(dy, x); break;
      case ScoreOp::div: v = x / y; dv = chain(dx, 1.0 / y) - chain(dy, v / y); break;
      case ScoreOp::pow:  // the exponent's term only where it moves (x^y's log needs x > 0)
        v = std::pow(x, y);
        dv = chain(dx, y * std::pow(x, y - 1.0)) + chain(dy, v * std::log(x));
        break;
      case ScoreOp::min: v = std::fmin(x, y); dv = x <= y ? dx : dy; break;
      case ScoreOp::max: v = std::fmax(x, y); dv = x >= y ? dx : dy; break;
      case ScoreOp::logical_and: v = (x != 0.0 && y != 0.0) ? 1.0 : 0.0; break;
      case ScoreOp::logical_or: v = (x != 0.0 || y != 0.0) ? 1.0 : 0.0; break;
      case ScoreOp::lt: v = x < y ? 1.0 : 0.0; break;
      case ScoreOp::le: v = x <= y ? 1.0 : 0.0; break;
      case ScoreOp::gt: v = x > y ? 1.0 : 0.0; break;
      case ScoreOp::ge: v = x >= y ? 1.0 : 0.0; break;
      case ScoreOp::eq: v = x == y ? 1.0 : 0.0; break;
      case ScoreOp::ne: v = x != y ? 1.0 : 0.0; break;
      case ScoreOp::select: v = x != 0.0 ? y : z; dv = x != 0.0 ? dy : dz; break;
      case ScoreOp::gather: throw std::logic_error("score_mod: a gather in a modifier (parse_score_mod refuses it)");
    }
  }
  return {value.back(), slope.back()};
}

}  // namespace fusedattn
