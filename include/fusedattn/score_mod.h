// fusedattn/score_mod.h — score modifiers: an element-wise expression of the attention score, its
// indices, runtime scalars and small broadcast tensors (what FlexAttention's score_mod computes),
// written in one line of text, compared by structure, and evaluated on the host for the reference.
//
//   ScoreMod softcap = parse_score_mod("mul(tanh(div(score,$0)),$0)");  // $0, the cap, given per call
//   to_string(softcap) == "mul(tanh(div(score,$0)),$0)"
//
// The text has no spaces (it travels inside the spec string):
//   expr := leaf | op "(" expr { "," expr } ")"
//   leaf := "score" | "b" | "h" | "q" | "kv"   the score and its indices: batch, head, query, key
//         | number                            a constant, inf and -inf included (a mask's value):
//                                             part of the structure (another value is another
//                                             expression)
//         | "$" N                             runtime scalar N, float32, given per call: changing it
//                                             keeps the structure
//         | "t" N "[" axes "]"                tensor N, float32, over a comma list of the axes
//                                             b, h, q, kv (in that order; contiguous, broadcast over
//                                             the axes it lacks), e.g. t0[h] per head
//   op   := neg abs exp log sqrt tanh sigmoid not      (one argument)
//         | floor ceil trunc sign                     (one argument: index arithmetic, as
//                                                        //, % and integer casts trace; sign
//                                                        gives -1, 0 or 1)
//         | add sub mul div pow min max and or          (two)
//         | lt le gt ge eq ne                           (two; 1 where true, else 0)
//         | select                                      (three: the second where the first is not
//                                                        0, else the third)
//         | "G" N                                       (1 to kMaxGatherIndices: tensor N gathered,
//                                                        its element at the arguments, one index per
//                                                        dimension; in expressions only)
// Scalars and tensors are numbered from 0 without gaps (at most kMaxScoreModScalars and
// kMaxScoreModTensors of them), and a tensor keeps one set of axes.
// Two modifiers are equal exactly when their expressions are the same tree.
//
// A gather reads a table at computed indices (a relative-position bias by clamped distance): cuDNN's
// score graph has no gather, so a modifier (ScoreMod, what a call runs) never holds one. A
// ScoreExpression, what the adapters trace a Python function into, may: its terms added to the score
// that gather move to the call's bias, which the adapter evaluates densely (score_expression.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fusedattn {

/// How many runtime scalars and tensors one modifier may use (slots $0 .. and t0 ..).
constexpr int kMaxScoreModScalars = 8;
constexpr int kMaxScoreModTensors = 4;
/// How many indices a gather takes: a tensor of the adapters' functions has at most the four axes
/// b, h, q, kv.
constexpr int kMaxGatherIndices = 4;

/// One node's operation. The leaves first, then by number of arguments.
enum class ScoreOp : std::uint8_t {
  score, batch, head, q_index, kv_index, constant, scalar, tensor,       // leaves
  neg, abs, exp, log, sqrt, tanh, sigmoid, logical_not, floor, ceil, trunc, sign,  // one argument
  add, sub, mul, div, pow, min, max, logical_and, logical_or,           // two
  lt, le, gt, ge, eq, ne,                                               // two, 1 or 0
  select,                                                               // three
  gather,                                                               // 1 to 4 (expressions only)
};

/// The operation's name in the text form ("add", "tanh", "select"; the leaves' "score", "b", "h",
/// "q", "kv"); "constant", "scalar", "tensor" and "gather" for the nodes the text writes by value
/// or slot.
std::string to_string(ScoreOp op);

/// The axes a tensor leaf spans, as bits: kAxisB | kAxisH | kAxisQ | kAxisKv.
constexpr std::uint8_t kAxisB = 1, kAxisH = 2, kAxisQ = 4, kAxisKv = 8;

/// One node; its arguments are earlier nodes (the expression is stored in post-order).
struct ScoreModNode {
  ScoreOp op = ScoreOp::score;
  double value = 0.0;              ///< constant: its value
  std::int32_t slot = 0;           ///< scalar, tensor, gather: the slot
  std::uint8_t axes = 0;           ///< tensor: the axes it spans
  std::array<std::int32_t, kMaxGatherIndices> args{-1, -1, -1, -1};  ///< the argument nodes, -1 after the last

  friend bool operator==(const ScoreModNode& a, const ScoreModNode& b) noexcept;
  friend bool operator!=(const ScoreModNode& a, const ScoreModNode& b) noexcept { return !(a == b); }
};

/// A parsed score modifier; empty means none. Immutable value type.
class ScoreMod {
 public:
  ScoreMod() = default;
  bool empty() const noexcept { return nodes_.empty(); }
  /// Post-order: every node after its arguments, the root last.
  const std::vector<ScoreModNode>& nodes() const noexcept { return nodes_; }
  /// How many runtime scalars ($0 ..) and tensors (t0 ..) a call passes.
  int scalars() const noexcept { return scalars_; }
  int tensors() const noexcept { return static_cast<int>(tensor_axes_.size()); }
  /// The axes of tensor slot i.
  std::uint8_t tensor_axes(int slot) const { return tensor_axes_.at(static_cast<std::size_t>(slot)); }

  friend bool operator==(const ScoreMod& a, const ScoreMod& b) noexcept { return a.nodes_ == b.nodes_; }
  friend bool operator!=(const ScoreMod& a, const ScoreMod& b) noexcept { return !(a == b); }

 private:
  friend ScoreMod parse_score_mod(const std::string& text);
  std::vector<ScoreModNode> nodes_;
  int scalars_ = 0;
  std::vector<std::uint8_t> tensor_axes_;
};

/// Parses the text form; "" gives the empty modifier. Throws InvalidArgument naming field
/// "score_mod", with the place it stopped and what it wanted there; a gather is refused there too
/// (cuDNN's score graph cannot run one).
ScoreMod parse_score_mod(const std::string& text);

/// `mod` with q read as q + q_offset and kv as kv + kv_offset: the modifier of a block of a larger
/// problem (its rows start at q_offset, its keys at kv_offset) written in that block's own indices.
ScoreMod shift_indices(const ScoreMod& mod, std::int64_t q_offset, std::int64_t kv_offset);

/// The text form (parses back to an equal modifier); "" for the empty one.
std::string to_string(const ScoreMod& mod);

/// Hash over the structure (equal modifiers hash equal).
std::size_t hash_value(const ScoreMod& mod) noexcept;

/// The dims of tensor `slot` of `mod` for a problem of sizes [b, h_q, s_q, s_kv]: those sizes along
/// the axes it spans, 1 (broadcast) along the others. It is contiguous in that shape.
std::array<std::int64_t, 4> tensor_dims(const ScoreMod& mod, int slot, const std::array<std::int64_t, 4>& sizes);

/// What one score's modification reads: its indices, the problem's sizes [b, h_q, s_q, s_kv] (which
/// place a tensor's elements), the runtime scalars and the tensors (float32, as their axes say).
struct ScoreModPoint {
  double score = 0.0;
  std::array<std::int64_t, 4> index{};  ///< b, h, q, kv
  std::array<std::int64_t, 4> sizes{};  ///< b, h_q, s_q, s_kv
  const float* scalars = nullptr;       ///< mod.scalars() values
  const float* const* tensors = nullptr;  ///< mod.tensors() pointers (host memory)
};

/// The modified score, in double precision (the host reference's). Comparisons give 1 or 0.
double evaluate(const ScoreMod& mod, const ScoreModPoint& point);

/// The modified score and its derivative with respect to the score (what the backward multiplies
/// dS by), each operation's own rule applied along the expression. Where a rule has a kink it
/// takes one side: abs has 0 at 0, min and max follow their first argument on a tie, comparisons,
/// logic and select's condition have derivative 0.
struct ScoreModValue {
  double value = 0.0;
  double d_score = 0.0;
};
ScoreModValue evaluate_with_derivative(const ScoreMod& mod, const ScoreModPoint& point);

}  // namespace fusedattn
