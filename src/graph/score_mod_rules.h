// Internal to the score_mod lowering (score_mod_lowering.cpp, its forward; and
// score_mod_lowering_backward.cpp): the rules about cuDNN's pointwise modes and the expression's
// operations that both directions apply.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>

#include "graph/score_mod_lowering.h"

namespace fusedattn::graph::score_mod_rules {

namespace fe = cudnn_frontend;
using Mode = ScoreModLowering::Mode;
using TensorPtr = ScoreModLowering::TensorPtr;

inline constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

inline bool is_virtual(const TensorPtr& tensor) { return tensor && tensor->get_is_virtual(); }

inline int index_axis(ScoreOp op) {
  switch (op) {
    case ScoreOp::batch: return 0;
    case ScoreOp::head: return 1;
    case ScoreOp::q_index: return 2;
    default: return 3;
  }
}

inline bool is_condition(ScoreOp op) {
  switch (op) {
    case ScoreOp::logical_not: case ScoreOp::logical_and: case ScoreOp::logical_or:
    case ScoreOp::lt: case ScoreOp::le: case ScoreOp::gt: case ScoreOp::ge: case ScoreOp::eq: case ScoreOp::ne:
      return true;
    default:
      return false;
  }
}

inline Mode comparison_mode(ScoreOp op) {
  switch (op) {
    case ScoreOp::lt: return Mode::CMP_LT;
    case ScoreOp::le: return Mode::CMP_LE;
    case ScoreOp::gt: return Mode::CMP_GT;
    case ScoreOp::ge: return Mode::CMP_GE;
    case ScoreOp::eq: return Mode::CMP_EQ;
    default: return Mode::CMP_NEQ;
  }
}

// Whether some operation's derivative can be infinite at finite arguments: log, sqrt and pow near
// 0, and a division by something that varies over the scores (by a constant, a runtime scalar or a
// tensor of the call it is as finite as the forward).
inline bool derivatives_may_overflow(const ScoreMod& mod) {
  const auto& nodes = mod.nodes();
  for (const ScoreModNode& n : nodes) {
    if (n.op == ScoreOp::log || n.op == ScoreOp::sqrt || n.op == ScoreOp::pow) return true;
    if (n.op == ScoreOp::div) {
      const ScoreOp divisor = nodes[static_cast<std::size_t>(n.args[1])].op;
      if (divisor != ScoreOp::constant && divisor != ScoreOp::scalar && divisor != ScoreOp::tensor) return true;
    }
  }
  return false;
}

// x op y == y mirrored(op) x
inline Mode mirrored(Mode mode) {
  switch (mode) {
    case Mode::CMP_LT: return Mode::CMP_GT;
    case Mode::CMP_LE: return Mode::CMP_GE;
    case Mode::CMP_GT: return Mode::CMP_LT;
    case Mode::CMP_GE: return Mode::CMP_LE;
    default: return mode;  // eq, ne and the commutative arithmetic
  }
}

// not (x op y) == x negated(op) y
inline Mode negated(Mode mode) {
  switch (mode) {
    case Mode::CMP_LT: return Mode::CMP_GE;
    case Mode::CMP_LE: return Mode::CMP_GT;
    case Mode::CMP_GT: return Mode::CMP_LE;
    case Mode::CMP_GE: return Mode::CMP_LT;
    case Mode::CMP_EQ: return Mode::CMP_NEQ;
    default: return Mode::CMP_EQ;
  }
}

inline bool commutes(Mode mode) {
  return mode == Mode::ADD || mode == Mode::MUL || mode == Mode::MIN || mode == Mode::MAX || mode == Mode::CMP_EQ ||
         mode == Mode::CMP_NEQ || mode == Mode::CMP_LT || mode == Mode::CMP_LE || mode == Mode::CMP_GT ||
         mode == Mode::CMP_GE;
}

inline TensorPtr constant(double value, bool integer) {
  if (integer) return std::make_shared<fe::graph::Tensor_attributes>(static_cast<std::int32_t>(value));
  return std::make_shared<fe::graph::Tensor_attributes>(static_cast<float>(value));
}

inline bool whole(double value) {
  return std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 2147483648.0;
}

// An arithmetic operation on constants, as the host evaluator computes it.
inline double fold(ScoreOp op, double x, double y) {
  switch (op) {
    case ScoreOp::neg: return -x;
    case ScoreOp::abs: return std::fabs(x);
    case ScoreOp::exp: return std::exp(x);
    case ScoreOp::log: return std::log(x);
    case ScoreOp::sqrt: return std::sqrt(x);
    case ScoreOp::tanh: return std::tanh(x);
    case ScoreOp::sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case ScoreOp::floor: return std::floor(x);
    case ScoreOp::ceil: return std::ceil(x);
    case ScoreOp::trunc: return std::trunc(x);
    case ScoreOp::sign: return x > 0.0 ? 1.0 : x < 0.0 ? -1.0 : 0.0;
    case ScoreOp::add: return x + y;
    case ScoreOp::sub: return x - y;
    case ScoreOp::mul: return x * y;
    case ScoreOp::div: return x / y;
    case ScoreOp::pow: return std::pow(x, y);
    case ScoreOp::min: return std::fmin(x, y);
    case ScoreOp::max: return std::fmax(x, y);
    default: throw std::logic_error("score_mod lowering: folding a non-arithmetic operation");
  }
}

}  // namespace fusedattn::graph::score_mod_rules
