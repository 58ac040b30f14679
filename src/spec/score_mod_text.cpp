// The score-modifier grammar's text form: a recursive-descent parser and its printer
// (score_mod_text.h), the one reading of the grammar for modifiers and traced expressions alike.
#include "spec/score_mod_text.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string_view>

#include "fusedattn/errors.h"
#include "spec/text.h"

namespace fusedattn {
namespace {

struct OpName {
  ScoreOp op;
  const char* name;
  int arity;
};

constexpr OpName kOps[] = {
    {ScoreOp::neg, "neg", 1},     {ScoreOp::abs, "abs", 1},      {ScoreOp::exp, "exp", 1},
    {ScoreOp::log, "log", 1},     {ScoreOp::sqrt, "sqrt", 1},    {ScoreOp::tanh, "tanh", 1},
    {ScoreOp::sigmoid, "sigmoid", 1}, {ScoreOp::logical_not, "not", 1},
    {ScoreOp::floor, "floor", 1}, {ScoreOp::ceil, "ceil", 1},    {ScoreOp::trunc, "trunc", 1},
    {ScoreOp::sign, "sign", 1},
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

const OpName* op_of(ScoreOp op) {
  for (const OpName& entry : kOps) {
    if (entry.op == op) return &entry;
  }
  return nullptr;
}

bool is_identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

class Parser {
 public:
  Parser(const std::string& text, detail::ScoreGrammar grammar) : text_(text), grammar_(grammar) {}

  std::vector<ScoreModNode> parse() {
    expression();
    if (at_ < text_.size()) fail("the end of the expression");
    return std::move(nodes_);
  }

 private:
  [[noreturn]] void fail(const std::string& wanted) const {
    throw InvalidArgument("score_mod", where(), wanted + " there");
  }

  std::string where() const { return "\"" + text_ + "\" at character " + std::to_string(at_); }

  void expect(char c) {
    if (at_ >= text_.size() || text_[at_] != c) fail(std::string("'") + c + "'");
    ++at_;
  }

  std::int32_t add(ScoreModNode node) {
    const std::size_t most =
        grammar_ == detail::ScoreGrammar::modifier ? detail::kMaxModifierNodes : detail::kMaxExpressionNodes;
    if (nodes_.size() >= most) fail("at most " + std::to_string(most) + " nodes");
    nodes_.push_back(node);
    return static_cast<std::int32_t>(nodes_.size() - 1);
  }

  std::int32_t digits() {
    const std::size_t start = at_;
    while (at_ < text_.size() && is_digit(text_[at_])) ++at_;
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

  // G<slot>(index, ...): only an expression's, as a modifier runs inside cuDNN's score graph.
  std::int32_t gather() {
    if (grammar_ == detail::ScoreGrammar::modifier) {
      throw InvalidArgument("score_mod", where(),
                            "a modifier without gathers: cuDNN's score graph cannot gather, so a term that reads "
                            "a tensor at computed indices (G<n>(...)) runs as the call's bias (fusedattn.torch and "
                            "fusedattn.jax move it there from a score_mod function)");
    }
    ++at_;
    ScoreModNode node;
    node.op = ScoreOp::gather;
    node.slot = digits();
    expect('(');
    for (int count = 0;;) {
      node.args[static_cast<std::size_t>(count++)] = expression();
      if (at_ >= text_.size() || text_[at_] != ',') break;
      if (count == kMaxGatherIndices) {
        fail("')': a gather takes at most " + std::to_string(kMaxGatherIndices) +
             " indices (a tensor spans at most b, h, q, kv)");
      }
      ++at_;
    }
    expect(')');
    return add(node);
  }

  std::int32_t expression() {
    if (at_ >= text_.size()) fail("an expression");
    const char c = text_[at_];
    const bool slot_follows = at_ + 1 < text_.size() && is_digit(text_[at_ + 1]);
    if (c == '$') {
      ++at_;
      ScoreModNode node;
      node.op = ScoreOp::scalar;
      node.slot = digits();
      return add(node);
    }
    if (is_digit(c) || c == '-' || c == '+' || c == '.') return number();
    if (c == 't' && slot_follows) {
      ++at_;
      ScoreModNode node;
      node.op = ScoreOp::tensor;
      node.slot = digits();
      node.axes = axes();
      return add(node);
    }
    if (c == 'G' && slot_follows) return gather();
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
  const detail::ScoreGrammar grammar_;
  std::size_t at_ = 0;
  std::vector<ScoreModNode> nodes_;
};

void print_index(const char* name, std::int64_t offset, std::string& out) {
  out += offset == 0 ? std::string(name) : std::string("add(") + name + "," + std::to_string(offset) + ")";
}

}  // namespace

std::string to_string(ScoreOp op) {
  for (const LeafName& leaf : kLeaves) {
    if (leaf.op == op) return leaf.name;
  }
  if (const OpName* named = op_of(op)) return named->name;
  switch (op) {
    case ScoreOp::constant: return "constant";
    case ScoreOp::scalar: return "scalar";
    case ScoreOp::tensor: return "tensor";
    case ScoreOp::gather: return "gather";
    default: throw std::logic_error("score_mod: an operation without a name");
  }
}

namespace detail {

std::vector<ScoreModNode> parse_score_nodes(const std::string& text, ScoreGrammar grammar) {
  return Parser(text, grammar).parse();
}

int argument_count(const ScoreModNode& node) {
  if (node.op == ScoreOp::gather) {
    int count = 0;
    while (count < kMaxGatherIndices && node.args[static_cast<std::size_t>(count)] >= 0) ++count;
    return count;
  }
  const OpName* op = op_of(node.op);
  return op == nullptr ? 0 : op->arity;
}

void print_score_node(const std::vector<ScoreModNode>& nodes, std::int32_t at, std::string& out, IndexOffsets offsets) {
  const ScoreModNode& node = nodes[static_cast<std::size_t>(at)];
  switch (node.op) {
    case ScoreOp::score: out += "score"; return;
    case ScoreOp::batch: out += "b"; return;
    case ScoreOp::head: out += "h"; return;
    case ScoreOp::q_index: print_index("q", offsets.q, out); return;
    case ScoreOp::kv_index: print_index("kv", offsets.kv, out); return;
    case ScoreOp::constant: out += format_double(node.value); return;
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
    case ScoreOp::gather: out += "G" + std::to_string(node.slot); break;
    default: out += to_string(node.op); break;
  }
  out += '(';
  for (int i = 0; i < argument_count(node); ++i) {
    if (i > 0) out += ',';
    print_score_node(nodes, node.args[static_cast<std::size_t>(i)], out, offsets);
  }
  out += ')';
}

}  // namespace detail
}  // namespace fusedattn
