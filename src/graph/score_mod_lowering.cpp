// Score modifiers as frontend pointwise operations (score_mod_lowering.h).
//
// Each node of the expression becomes operations on the [b, h_q, s_q, s_kv] score tensor (or on
// tensors that broadcast to it). What cuDNN 9.19's fused kernels take, as measured on the H200,
// shapes the lowering:
//   - every operation's first input must be a virtual tensor (one the kernel computes: the score,
//     an index, another operation's result), never a constant, a scalar or a tensor of the call;
//     emit() reorders commutative operations, mirrors comparisons, rewrites c - x and c / x, and
//     otherwise first makes the operand virtual (0 * score + c);
//   - cuDNN 9.26 takes an addition of a tensor of the call for a bias add, which must be row major
//     over the keys: a tensor broadcast over them (a length, a tensor indexed by batch or head)
//     finds no engine ("bias layout should be row major"), so x + t is written x - (0 - t) there;
//   - there is no logical and / or / not: conditions are lowered where a select uses them, as
//     nested selects (and(a, b) ? x : y is a ? (b ? x : y) : y), and a condition used as a number
//     is a select of 1 and 0.
// Values have one of three kinds: int32 (the indices and integer arithmetic on them, exact as in
// the host evaluator), conditions, and float32 (everything else). The backward walks the
// expression from the root to the score leaves, multiplying dS by each operation's local
// derivative; the window and padding conditions mask the forward's scores with -inf and dS with 0.
#include "graph/score_mod_lowering.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "graph/score_mod_rules.h"

namespace fusedattn::graph {

using namespace score_mod_rules;  // NOLINT: the lowering's own rules, shared with its backward

// One operation, its first input made virtual (see the top of the file).
TensorPtr ScoreModLowering::emit(Mode mode, std::vector<TensorPtr> in, Kind compute, Kind out) {
  if (mode == Mode::ADD && in.size() == 2 && is_virtual(in[0]) && compute == Kind::real && broadcast_over_keys(in[1])) {
    return emit(Mode::SUB, {in[0], real(Mode::SUB, {zero(), in[1]})}, compute, out);  // x - (0 - t)
  }
  if (!is_virtual(in[0])) {
    if (in.size() == 2 && is_virtual(in[1]) && commutes(mode)) {
      std::swap(in[0], in[1]);
      mode = mirrored(mode);
    } else if (in.size() == 2 && is_virtual(in[1]) && mode == Mode::SUB) {  // c - x = -x + c
      return emit(Mode::ADD, {emit(Mode::NEG, {in[1]}, compute, compute), in[0]}, compute, out);
    } else if (in.size() == 2 && is_virtual(in[1]) && mode == Mode::DIV) {  // c / x = (1 / x) * c
      return emit(Mode::MUL, {emit(Mode::RECIPROCAL, {in[1]}, Kind::real, Kind::real), in[0]}, Kind::real, out);
    } else {
      in[0] = materialized(in[0]);
      if (compute == Kind::integer) compute = Kind::real;  // the operand is float32 now
      if (out == Kind::integer) out = Kind::real;
    }
  }
  static constexpr fe::DataType_t kTypes[] = {fe::DataType_t::INT32, fe::DataType_t::BOOLEAN, fe::DataType_t::FLOAT};
  auto attributes = fe::graph::Pointwise_attributes()
                        .set_name("score_mod_" + std::to_string(names_++))
                        .set_mode(mode)
                        .set_compute_data_type(kTypes[static_cast<int>(compute)]);
  emitted_.push_back(Emitted{mode, is_virtual(in[0]), mode == Mode::ADD && in.size() == 2 && broadcast_over_keys(in[1])});
  TensorPtr result;
  if (in.size() == 1) {
    result = graph_->pointwise(in[0], attributes);
  } else if (in.size() == 2) {
    result = graph_->pointwise(in[0], in[1], attributes);
  } else {
    result = graph_->pointwise(in[0], in[1], in[2], attributes);
  }
  result->set_data_type(kTypes[static_cast<int>(out)]);
  return result;
}

// Zero in the score's shape, virtual: anchor * 0 (the anchor is finite).
TensorPtr ScoreModLowering::zero() {
  if (!zero_) zero_ = emit(Mode::MUL, {anchor_, constant(0.0, false)}, Kind::real, Kind::real);
  return zero_;
}

// Whether `tensor` is an input of the call (not a constant passed by value) that does not run along
// the keys with stride 1: one cuDNN 9.26 refuses to add.
bool ScoreModLowering::broadcast_over_keys(const TensorPtr& tensor) {
  if (is_virtual(tensor) || tensor->get_is_pass_by_value()) return false;
  const std::vector<std::int64_t> dims = tensor->get_dim(), strides = tensor->get_stride();
  return dims.size() != 4 || strides.size() != 4 || dims[3] == 1 || strides[3] != 1;
}

// A constant, scalar or tensor as a virtual float32 tensor: 0 * anchor + it.
TensorPtr ScoreModLowering::materialized(const TensorPtr& tensor) {
  return emit(Mode::ADD, {zero(), tensor}, Kind::real, Kind::real);
}

bool ScoreModLowering::small_power(const Value& exponent) {
  return !exponent.tensor && exponent.kind != Kind::condition && whole(exponent.constant) && exponent.constant >= 2.0 &&
         exponent.constant <= 8.0;
}

// x^n, n >= 1, as products (x^4 = (x x)(x x)).
TensorPtr ScoreModLowering::product(const TensorPtr& x, int n) {
  if (n == 1) return x;
  const TensorPtr half = product(x, n / 2);
  const TensorPtr square = real(Mode::MUL, {half, half});
  return n % 2 ? real(Mode::MUL, {square, x}) : square;
}

TensorPtr ScoreModLowering::index(int axis) {
  auto attributes = fe::graph::Pointwise_attributes()
                        .set_name("score_mod_" + std::to_string(names_++))
                        .set_mode(Mode::GEN_INDEX)
                        .set_axis(axis)
                        .set_compute_data_type(fe::DataType_t::INT32);
  emitted_.push_back(Emitted{Mode::GEN_INDEX, is_virtual(anchor_)});
  auto out = graph_->pointwise(anchor_, attributes);
  out->set_data_type(fe::DataType_t::INT32);
  return out;
}

// Node `node`'s value as a number of `kind` (int32 only where it is one): constants are made in
// that kind, a condition becomes a select of 1 and 0.
TensorPtr ScoreModLowering::number(const Value& value, Kind kind, std::size_t node) {
  if (value.kind == Kind::condition) return select_on(node, materialized(constant(1.0, false)), zero());
  if (!value.tensor) return constant(value.constant, kind == Kind::integer);
  return value.tensor;
}

TensorPtr ScoreModLowering::value_of(std::int32_t node) {
  const auto i = static_cast<std::size_t>(node);
  return number(values_[i], Kind::real, i);
}

// A comparison node as a boolean tensor, in integer compute where both sides are integers.
TensorPtr ScoreModLowering::compare(Mode mode, std::size_t node) {
  const ScoreModNode& n = spec_.score_mod.nodes()[node];
  const Value& a = values_[static_cast<std::size_t>(n.args[0])];
  const Value& b = values_[static_cast<std::size_t>(n.args[1])];
  auto integral = [](const Value& v) { return v.tensor ? v.kind == Kind::integer : whole(v.constant); };
  const bool integer = integral(a) && integral(b) && a.kind != Kind::condition && b.kind != Kind::condition;
  const Kind kind = integer ? Kind::integer : Kind::real;
  return emit(mode, {number(a, kind, static_cast<std::size_t>(n.args[0])), number(b, kind, static_cast<std::size_t>(n.args[1]))},
              integer ? Kind::condition : Kind::real, Kind::condition);
}

// condition ? yes : no, the condition's logic lowered into selects on comparisons.
TensorPtr ScoreModLowering::select_on(std::size_t condition, TensorPtr yes, TensorPtr no) {
  const ScoreModNode& n = spec_.score_mod.nodes()[condition];
  const Value& c = values_[condition];
  if (c.kind != Kind::condition) {  // a number: "not 0"
    if (!c.tensor) return c.constant != 0.0 ? yes : no;
    const TensorPtr zero = constant(0.0, c.kind == Kind::integer);
    const Kind compute = c.kind == Kind::integer ? Kind::condition : Kind::real;
    if (!is_virtual(yes) && is_virtual(no)) {
      return emit(Mode::BINARY_SELECT, {no, yes, emit(Mode::CMP_EQ, {c.tensor, zero}, compute, Kind::condition)},
                  Kind::real, Kind::real);
    }
    return emit(Mode::BINARY_SELECT, {yes, no, emit(Mode::CMP_NEQ, {c.tensor, zero}, compute, Kind::condition)},
                Kind::real, Kind::real);
  }
  const auto arg = [&](int k) { return static_cast<std::size_t>(n.args[static_cast<std::size_t>(k)]); };
  switch (n.op) {
    case ScoreOp::logical_and: return select_on(arg(0), select_on(arg(1), yes, no), no);
    case ScoreOp::logical_or: return select_on(arg(0), yes, select_on(arg(1), yes, no));
    case ScoreOp::logical_not: return select_on(arg(0), no, yes);
    default: break;
  }
  // A comparison: with a virtual first branch as it is, else negated with the branches swapped.
  if (!is_virtual(yes) && is_virtual(no)) {
    return emit(Mode::BINARY_SELECT, {no, yes, compare(negated(comparison_mode(n.op)), condition)}, Kind::real,
                Kind::real);
  }
  return emit(Mode::BINARY_SELECT, {yes, no, c.tensor}, Kind::real, Kind::real);
}

ScoreModLowering::Value ScoreModLowering::lower_node(std::size_t i) {
  const ScoreModNode& node = spec_.score_mod.nodes()[i];
  auto arg_index = [&](int k) { return static_cast<std::size_t>(node.args[static_cast<std::size_t>(k)]); };
  auto arg = [&](int k) -> const Value& { return values_[arg_index(k)]; };
  const int arity = node.args[2] >= 0 ? 3 : node.args[1] >= 0 ? 2 : node.args[0] >= 0 ? 1 : 0;
  // Integer arithmetic stays integer where every argument is an index or a whole constant.
  bool integral = arity > 0;
  bool constant_only = arity > 0;
  for (int k = 0; k < arity; ++k) {
    const Value& a = arg(k);
    integral = integral && (a.tensor ? a.kind == Kind::integer : a.kind != Kind::condition && whole(a.constant));
    constant_only = constant_only && !a.tensor && a.kind != Kind::condition;
  }
  const Kind arithmetic = integral ? Kind::integer : Kind::real;
  auto operand = [&](int k, Kind kind) { return number(arg(k), kind, arg_index(k)); };
  auto unary = [&](Mode mode, Kind kind) { return Value{kind, emit(mode, {operand(0, kind)}, kind, kind)}; };
  auto binary = [&](Mode mode, Kind kind) {
    return Value{kind, emit(mode, {operand(0, kind), operand(1, kind)}, kind, kind)};
  };
  if (constant_only && !is_condition(node.op) && node.op != ScoreOp::select) {
    // Folded: no operation on constants alone reaches cuDNN.
    return Value{Kind::real, nullptr, fold(node.op, arg(0).constant, arity > 1 ? arg(1).constant : 0.0)};
  }
  switch (node.op) {
    case ScoreOp::score: return Value{Kind::real, anchor_};
    case ScoreOp::batch: case ScoreOp::head: case ScoreOp::q_index: case ScoreOp::kv_index:
      return Value{Kind::integer, index(index_axis(node.op))};
    case ScoreOp::constant: return Value{Kind::real, nullptr, node.value};
    case ScoreOp::scalar: return Value{Kind::real, inputs_.scalars.at(static_cast<std::size_t>(node.slot))};
    case ScoreOp::tensor: return Value{Kind::real, inputs_.tensors.at(static_cast<std::size_t>(node.slot))};
    case ScoreOp::neg: return unary(Mode::NEG, arithmetic);
    // In float32 even on integers: in cuDNN 9.19's backward an int32 ABS that feeds a float
    // operation gives infinite gradients (sqrt(|kv - q|), written three ways, on the H200), while
    // an int32 ABS that feeds int32 arithmetic, and every other int32 operation, is right.
    case ScoreOp::abs: return unary(Mode::ABS, Kind::real);
    case ScoreOp::exp: return unary(Mode::EXP, Kind::real);
    case ScoreOp::log: return unary(Mode::LOG, Kind::real);
    case ScoreOp::sqrt: return unary(Mode::SQRT, Kind::real);
    case ScoreOp::tanh: return unary(Mode::TANH_FWD, Kind::real);
    case ScoreOp::sigmoid: return unary(Mode::SIGMOID_FWD, Kind::real);
    // An integer (an index, or arithmetic of indices and whole constants) is its own floor and ceil.
    case ScoreOp::floor: return arithmetic == Kind::integer ? arg(0) : unary(Mode::FLOOR, Kind::real);
    case ScoreOp::ceil: return arithmetic == Kind::integer ? arg(0) : unary(Mode::CEIL, Kind::real);
    case ScoreOp::trunc: {  // cuDNN has no truncation: x < 0 ? ceil(x) : floor(x), on one x
      if (arithmetic == Kind::integer) return arg(0);
      const TensorPtr x = operand(0, Kind::real);
      const TensorPtr negative = emit(Mode::CMP_LT, {x, constant(0.0, false)}, Kind::real, Kind::condition);
      return Value{Kind::real, emit(Mode::BINARY_SELECT, {emit(Mode::CEIL, {x}, Kind::real, Kind::real),
                                                          emit(Mode::FLOOR, {x}, Kind::real, Kind::real), negative},
                                    Kind::real, Kind::real)};
    }
    case ScoreOp::sign: {  // (x > 0) - (x < 0), in float32
      const TensorPtr x = operand(0, Kind::real), zero_value = constant(0.0, false);
      const TensorPtr one_value = materialized(constant(1.0, false));
      const TensorPtr positive = emit(Mode::BINARY_SELECT, {one_value, zero(), emit(Mode::CMP_GT, {x, zero_value},
                                                                                     Kind::real, Kind::condition)},
                                      Kind::real, Kind::real);
      const TensorPtr negative = emit(Mode::BINARY_SELECT, {one_value, zero(), emit(Mode::CMP_LT, {x, zero_value},
                                                                                     Kind::real, Kind::condition)},
                                      Kind::real, Kind::real);
      return Value{Kind::real, emit(Mode::SUB, {positive, negative}, Kind::real, Kind::real)};
    }
    case ScoreOp::add: return binary(Mode::ADD, arithmetic);
    case ScoreOp::sub: return binary(Mode::SUB, arithmetic);
    case ScoreOp::mul: return binary(Mode::MUL, arithmetic);
    case ScoreOp::div: return binary(Mode::DIV, Kind::real);  // the evaluator's division is real
    case ScoreOp::pow:
      // Whole powers 2 .. 8 as products: cuDNN's power takes no negative base (exp2(y log2 x)).
      if (small_power(arg(1))) return Value{Kind::real, product(operand(0, Kind::real), static_cast<int>(arg(1).constant))};
      return binary(Mode::POW, Kind::real);
    case ScoreOp::min: return binary(Mode::MIN, arithmetic);
    case ScoreOp::max: return binary(Mode::MAX, arithmetic);
    case ScoreOp::lt: case ScoreOp::le: case ScoreOp::gt: case ScoreOp::ge: case ScoreOp::eq: case ScoreOp::ne:
      return Value{Kind::condition, compare(comparison_mode(node.op), i)};
    case ScoreOp::logical_and: case ScoreOp::logical_or: case ScoreOp::logical_not:
      return Value{Kind::condition, nullptr};  // lowered where used (select_on)
    case ScoreOp::select: {
      const Value& condition = arg(0);
      if (!condition.tensor && condition.kind != Kind::condition) return condition.constant != 0.0 ? arg(1) : arg(2);
      // float32 (int32 branches convert): a select's compute type is one for both branches.
      return Value{Kind::real, select_on(arg_index(0), operand(1, Kind::real), operand(2, Kind::real))};
    }
  }
  throw std::logic_error("score_mod lowering: an operation without a rule");
}

TensorPtr ScoreModLowering::forward(Graph& graph, const TensorPtr& score) {
  graph_ = &graph;
  anchor_ = score;
  zero_ = nullptr;
  values_.clear();
  const auto& nodes = spec_.score_mod.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) values_.push_back(lower_node(i));
  TensorPtr modified = number(values_.back(), Kind::real, nodes.size() - 1);
  if (!is_virtual(modified)) modified = materialized(modified);  // a constant expression, score-shaped
  // With fixed lengths the window is written as the frontend writes its own (diagonal_band_mask),
  // a form cuDNN's kernels recognize and skip the tiles past (H200, a causal softcap at 2 x 8k:
  // 1.19 ms forward and 3.26 backward, against 2.21 and 8.65 with the window as conditions).
  if (window_as_band()) {
    keep_.clear();
    return band_mask(modified);
  }
  keep_ = visibility();
  for (const TensorPtr& keep : keep_) {
    modified = emit(Mode::BINARY_SELECT, {modified, constant(kNegativeInfinity, false), keep}, Kind::real, Kind::real);
  }
  return modified;
}

// Not where the backward masks dS again with the window's conditions (a derivative that may
// overflow): those would have to be built beside the band, and that form is the one measured.
bool ScoreModLowering::window_as_band() const noexcept {
  return spec_.window.bounded() && !(inputs_.seq_len_q && inputs_.seq_len_kv) &&
         !derivatives_may_overflow(spec_.score_mod);
}

// The window as the frontend's sliding-window mask builds it from diagonal band masks (right bound
// first, then left), with the lengths fixed: keep row + shift + right >= col, and col + left - shift
// > row, shift = s_kv - s_q bottom-right and 0 top-left.
TensorPtr ScoreModLowering::band_mask(TensorPtr modified) {
  using Attributes = fe::graph::DiagonalBandMask_attributes;
  const bool bottom_right = spec_.alignment == Alignment::bottom_right;
  const auto minus_infinity = [] { return constant(kNegativeInfinity, false); };
  if (spec_.window.right >= 0) {
    const TensorPtr s_q = bottom_right ? constant(static_cast<double>(spec_.seq_q()), true) : nullptr;
    const TensorPtr s_kv = bottom_right ? constant(static_cast<double>(spec_.seq_kv()), true) : nullptr;
    const TensorPtr right = spec_.window.right != 0 ? constant(static_cast<double>(spec_.window.right), true) : nullptr;
    modified = graph_->diagonal_band_mask(modified, minus_infinity(), s_q, s_kv, nullptr, nullptr, nullptr, right,
                                          Attributes().set_name("window_right").set_comparison_mode(Mode::CMP_GE));
  }
  if (spec_.window.left >= 0) {
    const double shift = bottom_right ? static_cast<double>(spec_.seq_kv() - spec_.seq_q()) : 0.0;
    modified = graph_->diagonal_band_mask(modified, minus_infinity(), nullptr, nullptr, nullptr, nullptr,
                                          constant(static_cast<double>(spec_.window.left) - shift, false), nullptr,
                                          Attributes().set_name("window_left").set_comparison_mode(Mode::CMP_GT));
  }
  return modified;
}

// The window "p - left < j <= p + right" of spec.h (p = i, or i + len_kv - len_q bottom-right,
// each entry's own lengths under padding) and the padding's rows and keys, as conditions that
// each keep the visible scores.
std::vector<TensorPtr> ScoreModLowering::visibility() {
  std::vector<TensorPtr> keep;
  const bool padded = inputs_.seq_len_q && inputs_.seq_len_kv;
  if (!padded && !spec_.window.bounded()) return keep;
  const TensorPtr row = index(2), column = index(3);
  auto integer = [&](Mode mode, const TensorPtr& a, const TensorPtr& b) { return emit(mode, {a, b}, Kind::integer, Kind::integer); };
  auto condition = [&](Mode mode, const TensorPtr& a, const TensorPtr& b) {
    return emit(mode, {a, b}, Kind::condition, Kind::condition);
  };
  if (spec_.window.bounded()) {
    // j - i - shift, shift = 0 top-left, s_kv - s_q bottom-right, and each entry's len_kv - len_q
    // under padding, as (j - len_kv) - (i - len_q): no length is added to a score-shaped tensor, which
    // cuDNN 9.26 takes for a bias add and refuses ("bias layout should be row major": no engine for a
    // padded call with a softcap and a bottom-right window, results/gpu-results-cudnn-9.26.0.51.md).
    TensorPtr offset;
    if (spec_.alignment == Alignment::bottom_right && padded) {
      offset = integer(Mode::SUB, integer(Mode::SUB, column, inputs_.seq_len_kv), integer(Mode::SUB, row, inputs_.seq_len_q));
    } else if (spec_.alignment == Alignment::bottom_right) {
      offset = integer(Mode::SUB, integer(Mode::SUB, column, row),
                       constant(static_cast<double>(spec_.seq_kv() - spec_.seq_q()), true));
    } else {
      offset = integer(Mode::SUB, column, row);
    }
    if (spec_.window.right >= 0) {
      keep.push_back(condition(Mode::CMP_LE, offset, constant(static_cast<double>(spec_.window.right), true)));
    }
    if (spec_.window.left >= 0) {
      keep.push_back(condition(Mode::CMP_GT, offset, constant(static_cast<double>(-spec_.window.left), true)));
    }
  }
  if (padded) {
    keep.push_back(condition(Mode::CMP_LT, row, inputs_.seq_len_q));
    keep.push_back(condition(Mode::CMP_LT, column, inputs_.seq_len_kv));
  }
  return keep;
}

const char* score_mod_lowering_build_stamp() noexcept { return __DATE__ " " __TIME__; }

}  // namespace fusedattn::graph
