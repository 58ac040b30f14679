// Score modifiers as frontend pointwise operations (score_mod_lowering.h).
//
// Each node of the expression becomes one operation on the [b, h_q, s_q, s_kv] score tensor (or on
// tensors that broadcast to it). Values have one of three kinds: int32 (the indices and integer
// arithmetic on them, exact as in the host evaluator), boolean (comparisons and logic) and float32
// (everything else); a use that needs another kind converts (a boolean as a number is 1 or 0, a
// number as a condition is "not 0"). The backward walks the expression from the root to the
// score leaves, multiplying dS by each operation's local derivative: every operation there
// involves the score-shaped gradient, the form cuDNN's fused backward takes.
#include "graph/score_mod_lowering.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace fusedattn::graph {

namespace fe = cudnn_frontend;
using Mode = fe::PointwiseMode_t;
using TensorPtr = ScoreModLowering::TensorPtr;

namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

int index_axis(ScoreOp op) {
  switch (op) {
    case ScoreOp::batch: return 0;
    case ScoreOp::head: return 1;
    case ScoreOp::q_index: return 2;
    default: return 3;
  }
}

// The derivative flows through every operation but comparisons, logic and a select's condition.
bool carries_derivative(ScoreOp op) {
  switch (op) {
    case ScoreOp::logical_not: case ScoreOp::logical_and: case ScoreOp::logical_or:
    case ScoreOp::lt: case ScoreOp::le: case ScoreOp::gt: case ScoreOp::ge: case ScoreOp::eq: case ScoreOp::ne:
      return false;
    default:
      return true;
  }
}

Mode comparison_mode(ScoreOp op) {
  switch (op) {
    case ScoreOp::lt: return Mode::CMP_LT;
    case ScoreOp::le: return Mode::CMP_LE;
    case ScoreOp::gt: return Mode::CMP_GT;
    case ScoreOp::ge: return Mode::CMP_GE;
    case ScoreOp::eq: return Mode::CMP_EQ;
    default: return Mode::CMP_NEQ;
  }
}

}  // namespace

std::string ScoreModLowering::next_name(const char* what) {
  return "score_mod_" + std::to_string(names_++) + "_" + what;
}

TensorPtr ScoreModLowering::constant(double value, Kind kind) const {
  if (kind == Kind::integer) return std::make_shared<fe::graph::Tensor_attributes>(static_cast<std::int32_t>(value));
  return std::make_shared<fe::graph::Tensor_attributes>(static_cast<float>(value));
}

TensorPtr ScoreModLowering::pointwise(Graph& graph, Mode mode, std::vector<TensorPtr> in, Kind compute, Kind out) {
  static constexpr fe::DataType_t kTypes[] = {fe::DataType_t::INT32, fe::DataType_t::BOOLEAN, fe::DataType_t::FLOAT};
  auto attributes = fe::graph::Pointwise_attributes()
                        .set_name(next_name("op"))
                        .set_mode(mode)
                        .set_compute_data_type(kTypes[static_cast<int>(compute)]);
  TensorPtr result;
  if (in.size() == 1) {
    result = graph.pointwise(in[0], attributes);
  } else if (in.size() == 2) {
    result = graph.pointwise(in[0], in[1], attributes);
  } else {
    result = graph.pointwise(in[0], in[1], in[2], attributes);
  }
  result->set_data_type(kTypes[static_cast<int>(out)]);
  return result;
}

// `value` in the kind a use needs: constants are made in it; a boolean becomes 1 or 0 and a
// number a condition (not 0); an int32 index serves a float operation as it is (cuDNN converts).
TensorPtr ScoreModLowering::as(Graph& graph, const Value& value, Kind kind) {
  if (!value.tensor) {
    if (kind == Kind::boolean) return constant(value.constant != 0.0 ? 1.0 : 0.0, Kind::integer);
    return constant(value.constant, kind);
  }
  if (kind == value.kind || (kind == Kind::real && value.kind == Kind::integer)) return value.tensor;
  if (kind == Kind::boolean) {
    return pointwise(graph, Mode::CMP_NEQ, {value.tensor, constant(0.0, value.kind)}, Kind::boolean, Kind::boolean);
  }
  // A boolean as a number, in the kind asked for.
  return pointwise(graph, Mode::BINARY_SELECT, {constant(1.0, kind), constant(0.0, kind), value.tensor}, kind, kind);
}

ScoreModLowering::Value ScoreModLowering::lower_node(Graph& graph, std::size_t i, const TensorPtr& score) {
  const ScoreModNode& node = spec_.score_mod.nodes()[i];
  auto arg = [&](int k) -> const Value& { return values_[static_cast<std::size_t>(node.args[static_cast<std::size_t>(k)])]; };
  const int arity = node.args[2] >= 0 ? 3 : node.args[1] >= 0 ? 2 : node.args[0] >= 0 ? 1 : 0;
  // Integer arithmetic stays integer where every argument is an index or a whole constant.
  bool integral = arity > 0;
  for (int k = 0; k < arity; ++k) {
    const Value& a = arg(k);
    integral = integral && (a.tensor ? a.kind == Kind::integer
                                     : std::isfinite(a.constant) && a.constant == std::trunc(a.constant) &&
                                           std::fabs(a.constant) < 2147483648.0);
  }
  const Kind arithmetic = integral ? Kind::integer : Kind::real;
  auto unary = [&](Mode mode, Kind compute) {
    return Value{compute, pointwise(graph, mode, {as(graph, arg(0), compute)}, compute, compute)};
  };
  auto binary = [&](Mode mode, Kind compute) {
    return Value{compute, pointwise(graph, mode, {as(graph, arg(0), compute), as(graph, arg(1), compute)}, compute, compute)};
  };
  auto compare = [&](Mode mode) {
    return Value{Kind::boolean, pointwise(graph, mode, {as(graph, arg(0), arithmetic), as(graph, arg(1), arithmetic)},
                                          integral ? Kind::boolean : Kind::real, Kind::boolean)};
  };
  auto logic = [&](Mode mode) {
    std::vector<TensorPtr> in;
    for (int k = 0; k < arity; ++k) in.push_back(as(graph, arg(k), Kind::boolean));
    return Value{Kind::boolean, pointwise(graph, mode, std::move(in), Kind::boolean, Kind::boolean)};
  };
  switch (node.op) {
    case ScoreOp::score: return Value{Kind::real, score};
    case ScoreOp::batch: case ScoreOp::head: case ScoreOp::q_index: case ScoreOp::kv_index: {
      auto attributes = fe::graph::Pointwise_attributes()
                            .set_name(next_name("index"))
                            .set_mode(Mode::GEN_INDEX)
                            .set_axis(index_axis(node.op))
                            .set_compute_data_type(fe::DataType_t::INT32);
      auto index = graph.pointwise(score, attributes);
      index->set_data_type(fe::DataType_t::INT32);
      return Value{Kind::integer, index};
    }
    case ScoreOp::constant: return Value{Kind::real, nullptr, node.value};
    case ScoreOp::scalar: return Value{Kind::real, inputs_.scalars.at(static_cast<std::size_t>(node.slot))};
    case ScoreOp::tensor: return Value{Kind::real, inputs_.tensors.at(static_cast<std::size_t>(node.slot))};
    case ScoreOp::neg: return unary(Mode::NEG, arithmetic);
    case ScoreOp::abs: return unary(Mode::ABS, arithmetic);
    case ScoreOp::exp: return unary(Mode::EXP, Kind::real);
    case ScoreOp::log: return unary(Mode::LOG, Kind::real);
    case ScoreOp::sqrt: return unary(Mode::SQRT, Kind::real);
    case ScoreOp::tanh: return unary(Mode::TANH_FWD, Kind::real);
    case ScoreOp::sigmoid: return unary(Mode::SIGMOID_FWD, Kind::real);
    case ScoreOp::logical_not: return logic(Mode::LOGICAL_NOT);
    case ScoreOp::add: return binary(Mode::ADD, arithmetic);
    case ScoreOp::sub: return binary(Mode::SUB, arithmetic);
    case ScoreOp::mul: return binary(Mode::MUL, arithmetic);
    case ScoreOp::div: return binary(Mode::DIV, Kind::real);  // the evaluator's division is real
    case ScoreOp::pow: return binary(Mode::POW, Kind::real);
    case ScoreOp::min: return binary(Mode::MIN, arithmetic);
    case ScoreOp::max: return binary(Mode::MAX, arithmetic);
    case ScoreOp::logical_and: return logic(Mode::LOGICAL_AND);
    case ScoreOp::logical_or: return logic(Mode::LOGICAL_OR);
    case ScoreOp::lt: case ScoreOp::le: case ScoreOp::gt: case ScoreOp::ge: case ScoreOp::eq: case ScoreOp::ne:
      return compare(comparison_mode(node.op));
    case ScoreOp::select: {
      // Integer where both branches are; the branches' kinds decide, the condition is boolean.
      const Value& yes = arg(1);
      const Value& no = arg(2);
      auto whole = [](const Value& v) {
        return v.tensor ? v.kind == Kind::integer : std::isfinite(v.constant) && v.constant == std::trunc(v.constant);
      };
      const Kind kind = whole(yes) && whole(no) ? Kind::integer : Kind::real;
      return Value{kind, pointwise(graph, Mode::BINARY_SELECT,
                                   {as(graph, yes, kind), as(graph, no, kind), as(graph, arg(0), Kind::boolean)}, kind,
                                   kind)};
    }
  }
  throw std::logic_error("score_mod lowering: an operation without a rule");
}

TensorPtr ScoreModLowering::forward(Graph& graph, const TensorPtr& score) {
  values_.clear();
  keep_ = nullptr;
  const auto& nodes = spec_.score_mod.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) values_.push_back(lower_node(graph, i, score));
  TensorPtr modified = as(graph, values_.back(), Kind::real);
  if (!values_.back().tensor) {
    // A constant expression still needs the score's shape: score * 0 + c.
    modified = pointwise(graph, Mode::MUL, {score, constant(0.0, Kind::real)}, Kind::real, Kind::real);
    modified = pointwise(graph, Mode::ADD, {modified, constant(values_.back().constant, Kind::real)}, Kind::real, Kind::real);
  }
  keep_ = visible(graph, score);
  if (!keep_) return modified;
  return pointwise(graph, Mode::BINARY_SELECT, {modified, constant(kNegativeInfinity, Kind::real), keep_}, Kind::real,
                   Kind::real);
}

// Which keys each query sees, as a boolean over the scores, or null when it sees every key: the
// window "p - left < j <= p + right" of spec.h with p = i, or p = i + len_kv - len_q bottom-right
// (each entry's own lengths under padding), and the padding rows and keys.
TensorPtr ScoreModLowering::visible(Graph& graph, const TensorPtr& score) {
  auto index = [&](int axis) {
    auto attributes = fe::graph::Pointwise_attributes()
                          .set_name(next_name("mask_index"))
                          .set_mode(Mode::GEN_INDEX)
                          .set_axis(axis)
                          .set_compute_data_type(fe::DataType_t::INT32);
    auto out = graph.pointwise(score, attributes);
    out->set_data_type(fe::DataType_t::INT32);
    return out;
  };
  auto both = [&](const TensorPtr& a, const TensorPtr& b) {
    if (!a) return b;
    return pointwise(graph, Mode::LOGICAL_AND, {a, b}, Kind::boolean, Kind::boolean);
  };
  auto integer = [&](Mode mode, const TensorPtr& a, const TensorPtr& b) {
    return pointwise(graph, mode, {a, b}, Kind::integer, Kind::integer);
  };
  auto compare = [&](Mode mode, const TensorPtr& a, const TensorPtr& b) {
    return pointwise(graph, mode, {a, b}, Kind::boolean, Kind::boolean);
  };
  const bool padded = inputs_.seq_len_q && inputs_.seq_len_kv;
  TensorPtr keep;
  TensorPtr row, column;
  if (padded || spec_.window.bounded()) {
    row = index(2);
    column = index(3);
  }
  if (spec_.window.bounded()) {
    // j - i - shift, shift = 0 top-left, len_kv - len_q bottom-right.
    TensorPtr offset = integer(Mode::SUB, column, row);
    if (spec_.alignment == Alignment::bottom_right) {
      if (padded) {
        offset = integer(Mode::SUB, integer(Mode::ADD, offset, inputs_.seq_len_q), inputs_.seq_len_kv);
      } else {
        offset = integer(Mode::SUB, offset, constant(static_cast<double>(spec_.seq_kv() - spec_.seq_q()), Kind::integer));
      }
    }
    if (spec_.window.right >= 0) {
      keep = both(keep, compare(Mode::CMP_LE, offset, constant(static_cast<double>(spec_.window.right), Kind::integer)));
    }
    if (spec_.window.left >= 0) {
      keep = both(keep, compare(Mode::CMP_GT, offset, constant(static_cast<double>(-spec_.window.left), Kind::integer)));
    }
  }
  if (padded) {
    keep = both(keep, compare(Mode::CMP_LT, row, inputs_.seq_len_q));
    keep = both(keep, compare(Mode::CMP_LT, column, inputs_.seq_len_kv));
  }
  return keep;
}

TensorPtr ScoreModLowering::backward(Graph& graph, const TensorPtr& d_modified) {
  const auto& nodes = spec_.score_mod.nodes();
  if (values_.size() != nodes.size()) throw std::logic_error("score_mod lowering: backward before forward");
  // Which nodes the score reaches through operations that carry a derivative.
  std::vector<bool> live(nodes.size(), false);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const ScoreModNode& n = nodes[i];
    if (n.op == ScoreOp::score) live[i] = true;
    if (!carries_derivative(n.op)) continue;
    const int first = n.op == ScoreOp::select ? 1 : 0;  // a select's condition carries none
    for (int k = first; k < 3; ++k) {
      if (n.args[static_cast<std::size_t>(k)] >= 0 && live[static_cast<std::size_t>(n.args[static_cast<std::size_t>(k)])]) {
        live[i] = true;
      }
    }
  }
  auto real = [&](Mode mode, std::vector<TensorPtr> in) {
    return pointwise(graph, mode, std::move(in), Kind::real, Kind::real);
  };
  auto value = [&](std::int32_t node) { return as(graph, values_[static_cast<std::size_t>(node)], Kind::real); };
  auto boolean = [&](std::int32_t node) { return as(graph, values_[static_cast<std::size_t>(node)], Kind::boolean); };
  const TensorPtr zero = constant(0.0, Kind::real);

  // Masked scores have P = 0 and so dS = 0, but the local derivatives there may not be finite (a
  // division by a distance that is 0 on the diagonal of a masked-out band, say): the gradient
  // is masked again, so that 0 * inf cannot leak into dQ and dK.
  TensorPtr root = d_modified;
  if (keep_) root = real(Mode::BINARY_SELECT, {d_modified, zero, keep_});
  std::vector<TensorPtr> adjoint(nodes.size());
  adjoint.back() = root;
  auto add_to = [&](std::int32_t node, TensorPtr d) {
    auto& slot = adjoint[static_cast<std::size_t>(node)];
    if (!live[static_cast<std::size_t>(node)]) return;
    slot = slot ? real(Mode::ADD, {slot, d}) : std::move(d);
  };
  TensorPtr d_score;
  for (std::size_t i = nodes.size(); i-- > 0;) {
    const TensorPtr& a = adjoint[i];
    if (!a || !live[i]) continue;
    const ScoreModNode& n = nodes[i];
    const std::int32_t x = n.args[0], y = n.args[1], z = n.args[2];
    switch (n.op) {
      case ScoreOp::score: d_score = d_score ? real(Mode::ADD, {d_score, a}) : a; break;
      case ScoreOp::neg: add_to(x, real(Mode::NEG, {a})); break;
      case ScoreOp::abs: {
        // sign(x) * a, with 0 at 0 as the evaluator has it.
        TensorPtr positive = pointwise(graph, Mode::CMP_GT, {value(x), zero}, Kind::real, Kind::boolean);
        TensorPtr negative = pointwise(graph, Mode::CMP_LT, {value(x), zero}, Kind::real, Kind::boolean);
        add_to(x, real(Mode::BINARY_SELECT, {a, real(Mode::BINARY_SELECT, {real(Mode::NEG, {a}), zero, negative}), positive}));
        break;
      }
      case ScoreOp::exp: add_to(x, real(Mode::MUL, {a, value(static_cast<std::int32_t>(i))})); break;
      case ScoreOp::log: add_to(x, real(Mode::DIV, {a, value(x)})); break;
      case ScoreOp::sqrt:
        add_to(x, real(Mode::DIV, {real(Mode::MUL, {a, constant(0.5, Kind::real)}), value(static_cast<std::int32_t>(i))}));
        break;
      case ScoreOp::tanh: {
        const TensorPtr t = value(static_cast<std::int32_t>(i));
        add_to(x, real(Mode::MUL, {a, real(Mode::SUB, {constant(1.0, Kind::real), real(Mode::MUL, {t, t})})}));
        break;
      }
      case ScoreOp::sigmoid: {
        const TensorPtr s = value(static_cast<std::int32_t>(i));
        add_to(x, real(Mode::MUL, {real(Mode::MUL, {a, s}), real(Mode::SUB, {constant(1.0, Kind::real), s})}));
        break;
      }
      case ScoreOp::add: add_to(x, a); add_to(y, a); break;
      case ScoreOp::sub: add_to(x, a); add_to(y, real(Mode::NEG, {a})); break;
      case ScoreOp::mul:
        if (live[static_cast<std::size_t>(x)]) add_to(x, real(Mode::MUL, {a, value(y)}));
        if (live[static_cast<std::size_t>(y)]) add_to(y, real(Mode::MUL, {a, value(x)}));
        break;
      case ScoreOp::div:
        if (live[static_cast<std::size_t>(x)]) add_to(x, real(Mode::DIV, {a, value(y)}));
        if (live[static_cast<std::size_t>(y)]) {
          add_to(y, real(Mode::NEG, {real(Mode::DIV, {real(Mode::MUL, {a, value(static_cast<std::int32_t>(i))}), value(y)})}));
        }
        break;
      case ScoreOp::pow:
        if (live[static_cast<std::size_t>(x)]) {
          // y * x^(y - 1) * a
          TensorPtr lowered = real(Mode::POW, {value(x), real(Mode::SUB, {value(y), constant(1.0, Kind::real)})});
          add_to(x, real(Mode::MUL, {real(Mode::MUL, {a, value(y)}), lowered}));
        }
        if (live[static_cast<std::size_t>(y)]) {
          add_to(y, real(Mode::MUL, {real(Mode::MUL, {a, value(static_cast<std::int32_t>(i))}), real(Mode::LOG, {value(x)})}));
        }
        break;
      case ScoreOp::min: case ScoreOp::max: {
        // To the first argument on a tie, as the evaluator.
        TensorPtr first = pointwise(graph, n.op == ScoreOp::min ? Mode::CMP_LE : Mode::CMP_GE, {value(x), value(y)},
                                    Kind::real, Kind::boolean);
        if (live[static_cast<std::size_t>(x)]) add_to(x, real(Mode::BINARY_SELECT, {a, zero, first}));
        if (live[static_cast<std::size_t>(y)]) add_to(y, real(Mode::BINARY_SELECT, {zero, a, first}));
        break;
      }
      case ScoreOp::select:
        if (live[static_cast<std::size_t>(y)]) add_to(y, real(Mode::BINARY_SELECT, {a, zero, boolean(x)}));
        if (live[static_cast<std::size_t>(z)]) add_to(z, real(Mode::BINARY_SELECT, {zero, a, boolean(x)}));
        break;
      default:
        break;  // leaves other than the score, comparisons and logic carry no derivative
    }
  }
  // An expression that ignores the score has dS = 0 before it.
  return d_score ? d_score : real(Mode::MUL, {d_modified, zero});
}

}  // namespace fusedattn::graph
