// The backward of a score modifier (score_mod_lowering.h): dS of the modified scores taken back
// through the expression to the score, each operation's local derivative as the host evaluator has
// it (fusedattn/score_mod.h), the window's and padding's conditions masking dS with 0.
#include <cstdint>
#include <vector>

#include "graph/score_mod_lowering.h"
#include "graph/score_mod_rules.h"

namespace fusedattn::graph {

using namespace score_mod_rules;  // NOLINT: the lowering's own rules

TensorPtr ScoreModLowering::backward(Graph& graph, const TensorPtr& d_modified) {
  const auto& nodes = spec_.score_mod.nodes();
  if (values_.size() != nodes.size()) throw std::logic_error("score_mod lowering: backward before forward");
  graph_ = &graph;
  anchor_ = d_modified;
  zero_ = nullptr;
  // Which nodes the score reaches through operations that carry a derivative (conditions and a
  // select's condition carry none).
  std::vector<bool> live(nodes.size(), false);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const ScoreModNode& n = nodes[i];
    if (n.op == ScoreOp::score) live[i] = true;
    if (is_condition(n.op)) continue;
    for (int k = n.op == ScoreOp::select ? 1 : 0; k < 3; ++k) {
      const std::int32_t a = n.args[static_cast<std::size_t>(k)];
      if (a >= 0 && live[static_cast<std::size_t>(a)]) live[i] = true;
    }
  }
  const TensorPtr zero_constant = constant(0.0, false);
  // Masked scores have P = 0 and so dS = 0, but where a local derivative there may not be finite
  // (a division by a distance that is 0 on a masked diagonal, a log or root of one) dS is masked
  // again, so that 0 * inf cannot reach dQ and dK. Only then: a causal softcap's one-call
  // backward took 8.65 ms against 5.75 without its mask on the H200, and the masks' conditions,
  // kept alive from the recomputed forward into this callback, are the likely part of that.
  TensorPtr root = d_modified;
  if (derivatives_may_overflow(spec_.score_mod)) {
    for (const TensorPtr& keep : keep_) root = real(Mode::BINARY_SELECT, {root, zero_constant, keep});
  }
  std::vector<TensorPtr> adjoint(nodes.size());
  adjoint.back() = root;
  // Adds the contribution `make()` to a live argument's adjoint; nothing is built for the others
  // (an unused operation would still be part of cuDNN's graph).
  auto add_to = [&](std::int32_t node, auto make) {
    if (node < 0 || !live[static_cast<std::size_t>(node)]) return;
    TensorPtr d = make();
    TensorPtr& slot = adjoint[static_cast<std::size_t>(node)];
    slot = slot ? real(Mode::ADD, {slot, d}) : d;
  };
  auto one = [&] { return constant(1.0, false); };
  TensorPtr d_score;
  for (std::size_t i = nodes.size(); i-- > 0;) {
    const TensorPtr a = adjoint[i];
    if (!a || !live[i]) continue;
    const ScoreModNode& n = nodes[i];
    const std::int32_t x = n.args[0], y = n.args[1], z = n.args[2];
    const auto self = static_cast<std::int32_t>(i);
    switch (n.op) {
      case ScoreOp::score: d_score = d_score ? real(Mode::ADD, {d_score, a}) : a; break;
      case ScoreOp::neg: add_to(x, [&] { return real(Mode::NEG, {a}); }); break;
      case ScoreOp::abs:  // sign(x) * a, with 0 at 0 as the evaluator has it
        add_to(x, [&] {
          const TensorPtr negative = emit(Mode::CMP_LT, {value_of(x), zero_constant}, Kind::real, Kind::condition);
          const TensorPtr positive = emit(Mode::CMP_GT, {value_of(x), zero_constant}, Kind::real, Kind::condition);
          return real(Mode::BINARY_SELECT, {a, real(Mode::BINARY_SELECT, {real(Mode::NEG, {a}), zero_constant, negative}), positive});
        });
        break;
      case ScoreOp::exp: add_to(x, [&] { return real(Mode::MUL, {a, value_of(self)}); }); break;
      case ScoreOp::log: add_to(x, [&] { return real(Mode::DIV, {a, value_of(x)}); }); break;
      case ScoreOp::sqrt:
        add_to(x, [&] { return real(Mode::DIV, {real(Mode::MUL, {a, constant(0.5, false)}), value_of(self)}); });
        break;
      case ScoreOp::tanh:  // a * (1 - t^2) = a - a t^2
        add_to(x, [&] {
          const TensorPtr t = value_of(self);
          return real(Mode::SUB, {a, real(Mode::MUL, {real(Mode::MUL, {a, t}), t})});
        });
        break;
      case ScoreOp::sigmoid:  // a * s * (1 - s) = a s - a s^2
        add_to(x, [&] {
          const TensorPtr s = value_of(self);
          const TensorPtr as = real(Mode::MUL, {a, s});
          return real(Mode::SUB, {as, real(Mode::MUL, {as, s})});
        });
        break;
      case ScoreOp::add: add_to(x, [&] { return a; }); add_to(y, [&] { return a; }); break;
      case ScoreOp::sub: add_to(x, [&] { return a; }); add_to(y, [&] { return real(Mode::NEG, {a}); }); break;
      case ScoreOp::mul:
        add_to(x, [&] { return real(Mode::MUL, {a, value_of(y)}); });
        add_to(y, [&] { return real(Mode::MUL, {a, value_of(x)}); });
        break;
      case ScoreOp::div:
        add_to(x, [&] { return real(Mode::DIV, {a, value_of(y)}); });
        add_to(y, [&] { return real(Mode::NEG, {real(Mode::DIV, {real(Mode::MUL, {a, value_of(self)}), value_of(y)})}); });
        break;
      case ScoreOp::pow:
        add_to(x, [&] {  // y x^(y - 1) a; with a constant y, y - 1 is folded (n x^(n-1) a, a product, for whole n)
          const Value& exponent = values_[static_cast<std::size_t>(y)];
          if (small_power(exponent)) {
            const int n = static_cast<int>(exponent.constant);
            const TensorPtr scaled = real(Mode::MUL, {a, constant(exponent.constant, false)});
            return n == 2 ? real(Mode::MUL, {scaled, value_of(x)}) : real(Mode::MUL, {scaled, product(value_of(x), n - 1)});
          }
          if (!exponent.tensor && exponent.kind != Kind::condition) {
            const TensorPtr lowered = real(Mode::POW, {value_of(x), constant(exponent.constant - 1.0, false)});
            return real(Mode::MUL, {real(Mode::MUL, {a, lowered}), constant(exponent.constant, false)});
          }
          const TensorPtr lowered = real(Mode::POW, {value_of(x), real(Mode::SUB, {value_of(y), one()})});
          return real(Mode::MUL, {real(Mode::MUL, {a, value_of(y)}), lowered});
        });
        add_to(y, [&] { return real(Mode::MUL, {real(Mode::MUL, {a, value_of(self)}), real(Mode::LOG, {value_of(x)})}); });
        break;
      case ScoreOp::min: case ScoreOp::max: {
        // To the first argument on a tie, as the evaluator; to the second where it is strictly chosen.
        const Mode first = n.op == ScoreOp::min ? Mode::CMP_LE : Mode::CMP_GE;
        add_to(x, [&] {
          return real(Mode::BINARY_SELECT, {a, zero_constant, emit(first, {value_of(x), value_of(y)}, Kind::real, Kind::condition)});
        });
        add_to(y, [&] {
          return real(Mode::BINARY_SELECT,
                      {a, zero_constant, emit(negated(first), {value_of(x), value_of(y)}, Kind::real, Kind::condition)});
        });
        break;
      }
      case ScoreOp::select:
        add_to(y, [&] { return select_on(static_cast<std::size_t>(x), a, zero_constant); });
        add_to(z, [&] { return select_on(static_cast<std::size_t>(x), zero_constant, a); });
        break;
      default:
        break;  // leaves other than the score, and conditions, carry no derivative
    }
  }
  // An expression that ignores the score has dS = 0 before it.
  return d_score ? d_score : zero();
}

}  // namespace fusedattn::graph
