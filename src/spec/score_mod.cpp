// Score modifiers: the text form (a recursive-descent parser and its printer), structural hashing,
// and the host evaluator the references use.
#include "fusedattn/score_mod.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string_view>

#include "fusedattn/errors.h"
#include "spec/text.h"

namespace fusedattn {
namespace {

// A spec string stays short; this also bounds the parser's recursion.
constexpr std::size_t kMaxNodes = 256;

struct OpName {
  ScoreOp op;
  const char* name;
  int arity;
};

constexpr OpName kOps[] = {
    {ScoreOp::neg, "neg", 1},     {ScoreOp::abs, "abs", 1},      {ScoreOp::exp, "exp", 1},
    {ScoreOp::log, "log", 1},     {ScoreOp::sqrt, "sqrt", 1},    {ScoreOp::tanh, "tanh", 1},
    {ScoreOp::sigmoid, "sigmoid", 1}, {ScoreOp::logical_not, "not", 1},
    {ScoreOp::add, "add", 2},     {ScoreOp::sub, "sub", 2},      {ScoreOp::mul, "mul", 2},
    {ScoreOp::div, "div", 2},     {ScoreOp::pow, "pow", 2},      {ScoreOp::min, "min", 2},
    {ScoreOp::max, "max", 2},     {ScoreOp::logical_and, "and", 2}, {ScoreOp::logical_or, "or", 2},
    {ScoreOp::lt, "lt", 2},       {ScoreOp::le, "le", 2},        {ScoreOp::gt, "gt", 2},
    {ScoreOp::ge, "ge", 2},       {ScoreOp::eq, "eq", 2},        {ScoreOp::ne, "ne", 2},
    {ScoreOp::select, "select", 3},
};

struct LeafName {
  ScoreOp op;
  const char* name;
};
constexpr LeafName kLeaves[] = {{ScoreOp::score, "score"}, {ScoreOp::batch, "b"}, {ScoreOp::head, "h"},
                                {ScoreOp::q_index, "q"},   {ScoreOp::kv_index, "kv"}};

constexpr const char* kAxisNames[] = {"b", "h", "q", "kv"};

const OpName* op_named(std::string_view name) {
  for (const OpName& entry : kOps) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

const OpName& op_of(ScoreOp op) {
  for (const OpName& entry : kOps) {
    if (entry.op == op) return entry;
  }
  throw std::logic_error("score_mod: an operation without a name");
}

bool is_identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  std::vector<ScoreModNode> parse() {
    expression();
    if (at_ < text_.size()) fail("the end of the expression");
    return std::move(nodes_);
  }

 private:
  [[noreturn]] void fail(const std::string& wanted) const {
    throw InvalidArgument("score_mod", "\"" + text_ + "\" at character " + std::to_string(at_), wanted + " there");
  }

  void expect(char c) {
    if (at_ >= text_.size() || text_[at_] != c) fail(std::string("'") + c + "'");
    ++at_;
  }

  std::int32_t add(ScoreModNode node) {
    if (nodes_.size() >= kMaxNodes) fail("at most " + std::to_string(kMaxNodes) + " nodes");
    nodes_.push_back(node);
    return static_cast<std::int32_t>(nodes_.size() - 1);
  }

  std::int32_t digits() {
    const std::size_t start = at_;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
    const auto value = detail::parse_int64(std::string_view(text_).substr(start, at_ - start));
    if (!value || *value > 1024) {
      at_ = start;
      fail("a slot number 0 .. 1024");
    }
    return static_cast<std::int32_t>(*value);
  }

  std::int32_t number() {
    const char* begin = text_.c_str() + at_;
    char* end = nullptr;
    const double value = std::strtod(begin, &end);
    if (end == begin || std::isnan(value)) fail("a number (inf and -inf are numbers, nan is not)");
    at_ += static_cast<std::size_t>(end - begin);
    ScoreModNode node;
    node.op = ScoreOp::constant;
    node.value = value;
    return add(node);
  }

  std::uint8_t axes() {
    expect('[');
    std::uint8_t bits = 0;
    int last = -1;
    while (true) {
      int axis = -1;
      for (int i = 0; i < 4; ++i) {
        const std::string_view name = kAxisNames[i];
        if (std::string_view(text_).substr(at_, name.size()) == name) {
          axis = i;
          break;
        }
      }
      if (axis <= last) fail("one of the axes b, h, q, kv, each once and in that order");
      at_ += std::string_view(kAxisNames[axis]).size();
      bits = static_cast<std::uint8_t>(bits | (1u << axis));
      last = axis;
      if (at_ < text_.size() && text_[at_] == ',') {
        ++at_;
        continue;
      }
      expect(']');
      return bits;
    }
  }

  std::int32_t expression() {
    if (at_ >= text_.size()) fail("an expression");
    const char c = text_[at_];
    if (c == '$') {
      ++at_;
      ScoreModNode node;
      node.op = ScoreOp::scalar;
      node.slot = digits();
      return add(node);
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.') return number();
    if (c == 't' && at_ + 1 < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_ + 1]))) {
      ++at_;
      ScoreModNode node;
      node.op = ScoreOp::tensor;
      node.slot = digits();
      node.axes = axes();
      return add(node);
    }
    const std::size_t start = at_;
    while (at_ < text_.size() && is_identifier_char(text_[at_])) ++at_;
    const std::string_view name = std::string_view(text_).substr(start, at_ - start);
    for (const LeafName& leaf : kLeaves) {
      if (name == leaf.name) {
        ScoreModNode node;
        node.op = leaf.op;
        return add(node);
      }
    }
    if (name == "inf") {  // as +inf prints
      ScoreModNode node;
      node.op = ScoreOp::constant;
      node.value = std::numeric_limits<double>::infinity();
      return add(node);
    }
    const OpName* op = op_named(name);
    if (op == nullptr) {
      at_ = start;
      fail("score, b, h, q, kv, a number, $N, tN[axes] or an operation (add, mul, tanh, select, ...)");
    }
    expect('(');
    ScoreModNode node;
    node.op = op->op;
    for (int i = 0; i < op->arity; ++i) {
      if (i > 0) expect(',');
      node.args[static_cast<std::size_t>(i)] = expression();
    }
    if (at_ < text_.size() && text_[at_] == ',') fail(std::string("')': ") + op->name + " takes " + std::to_string(op->arity));
    expect(')');
    return add(node);
  }

  const std::string& text_;
  std::size_t at_ = 0;
  std::vector<ScoreModNode> nodes_;
};

// The offsets shift_indices() adds to the query and key indices (0: printed as they are).
struct IndexOffsets {
  std::int64_t q = 0, kv = 0;
};

void print_index(const char* name, std::int64_t offset, std::string& out) {
  out += offset == 0 ? std::string(name) : std::string("add(") + name + "," + std::to_string(offset) + ")";
}

void print(const std::vector<ScoreModNode>& nodes, std::int32_t at, std::string& out, IndexOffsets offsets = {}) {
  const ScoreModNode& node = nodes[static_cast<std::size_t>(at)];
  switch (node.op) {
    case ScoreOp::score: out += "score"; return;
    case ScoreOp::batch: out += "b"; return;
    case ScoreOp::head: out += "h"; return;
    case ScoreOp::q_index: print_index("q", offsets.q, out); return;
    case ScoreOp::kv_index: print_index("kv", offsets.kv, out); return;
    case ScoreOp::constant: out += detail::format_double(node.value); return;
    case ScoreOp::scalar: out += "$" + std::to_string(node.slot); return;
    case ScoreOp::tensor: {
      out += "t" + std::to_string(node.slot) + "[";
      bool first = true;
      for (int axis = 0; axis < 4; ++axis) {
        if (!(node.axes & (1u << axis))) continue;
        if (!first) out += ',';
        out += kAxisNames[axis];
        first = false;
      }
      out += "]";
      return;
    }
    default: break;
  }
  const OpName& op = op_of(node.op);
  out += op.name;
  out += '(';
  for (int i = 0; i < op.arity; ++i) {
    if (i > 0) out += ',';
    print(nodes, node.args[static_cast<std::size_t>(i)], out, offsets);
  }
  out += ')';
}

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
  mod.nodes_ = Parser(text).parse();
  number_slots(text, mod.nodes_, mod.scalars_, mod.tensor_axes_);
  return mod;
}

ScoreMod shift_indices(const ScoreMod& mod, std::int64_t q_offset, std::int64_t kv_offset) {
  if (mod.empty()) return mod;
  std::string text;
  print(mod.nodes(), static_cast<std::int32_t>(mod.nodes().size() - 1), text, IndexOffsets{q_offset, kv_offset});
  return parse_score_mod(text);
}

std::string to_string(const ScoreMod& mod) {
  std::string out;
  if (!mod.empty()) print(mod.nodes(), static_cast<std::int32_t>(mod.nodes().size() - 1), out);
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
    }
  }
  return {value.back(), slope.back()};
}

}  // namespace fusedattn
