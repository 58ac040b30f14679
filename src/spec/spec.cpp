// AttentionSpec: one field list drives equality, hashing, the one-line string and its parser; plus validation.
#include "fusedattn/spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/support.h"
#include "spec/fields.h"
#include "spec/text.h"
#include "spec/window_rule.h"

namespace fusedattn {
namespace {

// THE field list. operator==, hash_value, to_string, parse_spec and the plan key's normalization
// (reset_unread_fields) all walk it, so adding a field here makes it compared, hashed, printed,
// parsed and keyed at once. `f(name, reads, field...)` is called once per field with the passes
// whose graphs read it and that field of every spec passed in (one spec to print, two to compare).
// A field one pass does not read is reset in that pass's plan key, so it can never split that
// pass's plans (a forward with bias_grad=1 builds the forward graph of bias_grad=0).
enum Reads : unsigned { kForwardReads = 1u, kBackwardReads = 2u, kBothRead = 3u };

template <class F, class... Specs>
void visit_fields(F&& f, Specs&... specs) {
  f("q", kBothRead, specs.q...);
  f("k", kBothRead, specs.k...);
  f("v", kBothRead, specs.v...);
  f("o", kBothRead, specs.o...);
  f("window", kBothRead, specs.window...);
  f("align", kBothRead, specs.alignment...);
  f("bias", kBothRead, specs.bias...);
  f("bias_grad", kBackwardReads, specs.bias_grad...);  // dBias is a backward output
  f("alibi", kBothRead, specs.alibi...);
  f("softmax", kBothRead, specs.softmax...);
  f("max_logit", kForwardReads, specs.max_logit...);
  f("dropout", kBothRead, specs.dropout...);
  f("dropout_mask_out", kForwardReads, specs.dropout_mask_out...);
  f("padding", kBothRead, specs.padding...);
  f("deterministic", kBackwardReads, specs.deterministic...);  // the backward's algorithm
  // Whether the forward writes the statistics; the backward always reads them.
  f("stats", kForwardReads, specs.stats...);
  f("kv_pages", kBothRead, specs.kv_pages...);
  f("fp8_scaling", kBothRead, specs.fp8_scaling...);  // which scale tensors both graphs take
  f("fp8_grads", kBackwardReads, specs.fp8_gradients...);  // dO's and the gradients' format
  f("score_mod", kBothRead, specs.score_mod...);      // by structure: its scalars' values are not here
}

template <class T>
constexpr bool kIsTensor = std::is_same_v<std::decay_t<T>, TensorDesc>;

// --- names of the enum fields: one table each serves to_string, printing and parsing ------------

template <class E>
struct Named {
  E value;
  const char* name;
};
constexpr Named<Alignment> kAlignmentNames[] = {{Alignment::top_left, "top_left"},
                                                {Alignment::bottom_right, "bottom_right"}};
constexpr Named<Bias> kBiasNames[] = {{Bias::none, "none"},       {Bias::bhss, "bhss"},       {Bias::b1ss, "b1ss"},
                                      {Bias::one_hss, "1hss"},    {Bias::one_1ss, "11ss"},    {Bias::one_11s, "111s"}};
constexpr Named<Softmax> kSoftmaxNames[] = {
    {Softmax::vanilla, "vanilla"}, {Softmax::off_by_one, "off_by_one"}, {Softmax::sink, "sink"}};
constexpr Named<MaxLogit> kMaxLogitNames[] = {{MaxLogit::none, "none"}, {MaxLogit::row, "row"}, {MaxLogit::head, "head"}};
constexpr Named<Fp8Scaling> kFp8ScalingNames[] = {
    {Fp8Scaling::tensor, "tensor"}, {Fp8Scaling::mxfp8, "mxfp8"}, {Fp8Scaling::head, "head"}};
constexpr Named<Fp8Gradients> kFp8GradientsNames[] = {{Fp8Gradients::as_inputs, "as_inputs"},
                                                      {Fp8Gradients::e5m2, "e5m2"}};

constexpr const auto& names_of(Alignment) { return kAlignmentNames; }
constexpr const auto& names_of(Bias) { return kBiasNames; }
constexpr const auto& names_of(Softmax) { return kSoftmaxNames; }
constexpr const auto& names_of(MaxLogit) { return kMaxLogitNames; }
constexpr const auto& names_of(Fp8Scaling) { return kFp8ScalingNames; }
constexpr const auto& names_of(Fp8Gradients) { return kFp8GradientsNames; }

template <class E>
const char* name_of(E value) noexcept {
  for (const auto& entry : names_of(value)) {
    if (entry.value == value) return entry.name;
  }
  return "unknown";
}

// --- one codec per field type -------------------------------------------------------------------

std::string format_value(const TensorDesc& desc) { return to_string(desc); }
std::string format_value(bool flag) { return flag ? "1" : "0"; }
std::string format_value(double value) { return detail::format_double(value); }
std::string format_value(std::int64_t value) { return std::to_string(value); }
template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
std::string format_value(E value) {
  return name_of(value);
}
std::string format_value(const Window& window) { return to_string(window); }
std::string format_value(const ScoreMod& mod) { return to_string(mod); }

void parse_value(const std::string& text, const std::string& key, TensorDesc& out) {
  out = parse_tensor_desc(text, key);
}
void parse_value(const std::string& text, const std::string& key, bool& out) {
  if (text == "1" || text == "true") {
    out = true;
  } else if (text == "0" || text == "false") {
    out = false;
  } else {
    throw InvalidArgument(key, text, "0 or 1");
  }
}
void parse_value(const std::string& text, const std::string& key, std::int64_t& out) {
  const std::optional<std::int64_t> value = detail::parse_int64(text);
  if (!value) throw InvalidArgument(key, text, "an integer");
  out = *value;
}
void parse_value(const std::string& text, const std::string& key, double& out) {
  char* end = nullptr;
  const double value = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value)) throw InvalidArgument(key, text, "a number");
  out = value;
}

// "LEFT,RIGHT", each -1 (unbounded) or a count; validate() checks the ranges.
void parse_value(const std::string& text, const std::string& key, Window& out) {
  const std::size_t comma = text.find(',');
  const std::optional<std::int64_t> left = detail::parse_int64(std::string_view(text).substr(0, comma));
  const std::optional<std::int64_t> right =
      comma == std::string::npos ? std::nullopt : detail::parse_int64(std::string_view(text).substr(comma + 1));
  if (!left || !right) throw InvalidArgument(key, text, "LEFT,RIGHT: two integers, -1 for no bound (causal is -1,0)");
  out = Window{*left, *right};
}

void parse_value(const std::string& text, const std::string&, ScoreMod& out) { out = parse_score_mod(text); }

template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
void parse_value(const std::string& text, const std::string& key, E& out) {
  std::string known;
  for (const auto& entry : names_of(out)) {
    if (text == entry.name) {
      out = entry.value;
      return;
    }
    known += std::string(known.empty() ? "one of " : ", ") + entry.name;
  }
  throw InvalidArgument(key, text, known);
}

std::size_t hash_of(const TensorDesc& desc) noexcept {
  std::size_t seed = static_cast<std::size_t>(desc.dtype);
  for (std::int64_t dim : desc.dims) detail::hash_combine(seed, std::hash<std::int64_t>{}(dim));
  for (std::int64_t stride : desc.strides) detail::hash_combine(seed, std::hash<std::int64_t>{}(stride));
  return seed;
}
std::size_t hash_of(bool flag) noexcept { return flag ? 1 : 0; }
std::size_t hash_of(double value) noexcept { return std::hash<double>{}(value); }
std::size_t hash_of(std::int64_t value) noexcept { return std::hash<std::int64_t>{}(value); }
template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
std::size_t hash_of(E value) noexcept {
  return static_cast<std::size_t>(value);
}
std::size_t hash_of(const ScoreMod& mod) noexcept { return hash_value(mod); }
std::size_t hash_of(const Window& window) noexcept {
  std::size_t seed = std::hash<std::int64_t>{}(window.left);
  detail::hash_combine(seed, std::hash<std::int64_t>{}(window.right));
  return seed;
}

// --- the short form: a layout name and sizes stand in for the four tensors ------------------------

struct SizeKey {
  const char* key;
  std::int64_t ProblemShape::*member;
};
constexpr SizeKey kSizeKeys[] = {
    {"b", &ProblemShape::batch},          {"s_q", &ProblemShape::seq_q},    {"s_kv", &ProblemShape::seq_kv},
    {"h_q", &ProblemShape::heads_q},      {"h_kv", &ProblemShape::heads_kv}, {"d_qk", &ProblemShape::head_dim_qk},
    {"d_v", &ProblemShape::head_dim_v},
};

// CLI conveniences: one key for a pair of sizes that are usually equal. Parsed only, never printed.
// A specific key wins over its shorthand in any order, so "h=32 h_kv=8" reads as GQA.
struct Shorthand {
  const char* key;
  const char* first;
  const char* second;
};
constexpr Shorthand kShorthands[] = {{"s", "s_q", "s_kv"}, {"h", "h_q", "h_kv"}, {"d", "d_qk", "d_v"}};

// Paged layouts' own sizes: a page's tokens and the pool's pages.
constexpr SizeKey kPageKeys[] = {{"page_size", &ProblemShape::page_size}, {"pages", &ProblemShape::pages}};

bool is_page_key(const std::string& key) {
  return std::any_of(std::begin(kPageKeys), std::end(kPageKeys), [&](const SizeKey& size) { return key == size.key; });
}

bool is_size_key(const std::string& key) {
  return std::any_of(std::begin(kSizeKeys), std::end(kSizeKeys), [&](const SizeKey& size) { return key == size.key; });
}

bool is_shorthand(const std::string& key) {
  return std::any_of(std::begin(kShorthands), std::end(kShorthands), [&](const Shorthand& s) { return key == s.key; });
}

std::string known_keys() {
  std::string out = "known keys:";
  AttentionSpec unused;
  visit_fields([&](const char* name, Reads, auto&) { out += std::string(" ") + name; }, unused);
  out += " layout dtype";
  for (const SizeKey& size : kSizeKeys) out += std::string(" ") + size.key;
  out += ", page_size pages (paged layouts), shorthands s h d, causal=0|1 and the bare word causal (no key right "
         "of the diagonal: the window's right bound 0)";
  return out;
}

bool fits_packing(Layout layout, const ProblemShape& shape) {
  if (packs_qkv(layout)) {
    return shape.seq_q == shape.seq_kv && shape.heads_q == shape.heads_kv && shape.head_dim_qk == shape.head_dim_v;
  }
  return !packs_kv(layout) || shape.head_dim_qk == shape.head_dim_v;
}

}  // namespace

std::array<std::int64_t, 4> bias_dims(Bias bias, std::int64_t batch, std::int64_t heads, std::int64_t seq_q,
                                      std::int64_t seq_kv) noexcept {
  switch (bias) {
    case Bias::none: return {0, 0, 0, 0};
    case Bias::bhss: return {batch, heads, seq_q, seq_kv};
    case Bias::b1ss: return {batch, 1, seq_q, seq_kv};
    case Bias::one_hss: return {1, heads, seq_q, seq_kv};
    case Bias::one_1ss: return {1, 1, seq_q, seq_kv};
    case Bias::one_11s: return {1, 1, 1, seq_kv};
  }
  return {0, 0, 0, 0};
}

TensorDesc bias_desc(const AttentionSpec& spec) {
  TensorDesc desc;
  desc.dtype = spec.q.dtype;
  desc.dims = bias_dims(spec.bias, spec.batch(), spec.heads_q(), spec.seq_q(), spec.seq_kv());
  desc.strides = contiguous_bhsd_strides(desc.dims);
  return desc;
}

AttentionSpec spec_for_layout(Layout layout, const ProblemShape& shape) {
  const LayoutTensors tensors = make_layout(layout, shape);
  AttentionSpec spec;
  spec.q = tensors.q;
  spec.k = tensors.k;
  spec.v = tensors.v;
  spec.o = tensors.o;
  spec.padding = ragged_q(layout) || ragged_kv(layout) || paged_kv(layout);
  if (paged_kv(layout)) spec.kv_pages = shape.seq_kv / shape.page_size;
  return spec;
}

ProblemShape problem_shape(const AttentionSpec& spec) {
  ProblemShape shape;
  shape.dtype = spec.q.dtype;
  shape.batch = spec.batch();
  shape.seq_q = spec.seq_q();
  shape.seq_kv = spec.seq_kv();
  shape.heads_q = spec.heads_q();
  shape.heads_kv = spec.heads_kv();
  shape.head_dim_qk = spec.head_dim_qk();
  shape.head_dim_v = spec.head_dim_v();
  if (spec.paged_kv()) {
    shape.page_size = spec.page_size();
    shape.pages = spec.k.batch();
  }
  return shape;
}

// The packing test up front keeps printing free of exceptions for the common GQA / s_q != s_kv specs.
std::optional<Layout> named_layout(const AttentionSpec& spec) {
  ProblemShape shape = problem_shape(spec);
  for (const SizeKey& size : kSizeKeys) {
    if (shape.*size.member <= 0) return std::nullopt;
  }
  for (Layout layout : all_layouts()) {
    if (!fits_packing(layout, shape) || paged_kv(layout) != spec.paged_kv()) continue;
    LayoutTensors tensors = make_layout(layout, shape);
    if (tensors.q == spec.q && tensors.k == spec.k && tensors.v == spec.v && tensors.o == spec.o) return layout;
  }
  return std::nullopt;
}

namespace {

std::string short_form(Layout layout, const ProblemShape& shape) {
  std::string out = std::string("layout=") + to_string(layout) + " dtype=" + to_string(shape.dtype);
  for (const SizeKey& size : kSizeKeys) out += std::string(" ") + size.key + "=" + std::to_string(shape.*size.member);
  if (paged_kv(layout)) {
    for (const SizeKey& size : kPageKeys) out += std::string(" ") + size.key + "=" + std::to_string(shape.*size.member);
  }
  return out;
}

// --- parsing ---------------------------------------------------------------------------------------

struct Token {
  std::string key;
  std::string value;
};

std::vector<Token> tokenize(const std::string& text) {
  std::vector<Token> tokens;
  for (std::size_t end = 0, start; (start = text.find_first_not_of(" \t\n", end)) != std::string::npos;) {
    end = text.find_first_of(" \t\n", start);
    const std::string word = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::size_t equals = word.find('=');
    if (equals != std::string::npos) {
      tokens.push_back({word.substr(0, equals), word.substr(equals + 1)});
    } else if (word == "causal") {
      tokens.push_back({"causal", "1"});
    } else {
      throw InvalidArgument(word, "", "a key=value token; " + known_keys());
    }
  }
  return tokens;
}

// Every key may be given once: a second value is more likely a slip than an intended override.
class GivenKeys {
 public:
  /// Records `token` as the one that sets `slot` (its own key unless it is an alias).
  void claim(const Token& token, const std::string& slot) {
    auto [it, fresh] = given_.emplace(slot, token);
    if (fresh) return;
    throw InvalidArgument(token.key, token.value,
                          "given once at most (already given as " + it->second.key + "=" + it->second.value + ")");
  }
  const Token* find(const std::string& key) const {
    auto it = given_.find(key);
    return it == given_.end() ? nullptr : &it->second;
  }
  /// The token that sets size `key`: the key itself, else the shorthand covering it.
  const Token* find_size(const std::string& key) const {
    if (const Token* token = find(key)) return token;
    for (const Shorthand& shorthand : kShorthands) {
      if (key == shorthand.first || key == shorthand.second) return find(shorthand.key);
    }
    return nullptr;
  }

 private:
  std::map<std::string, Token> given_;
};

std::int64_t parse_size(const Token& token) {
  auto value = detail::parse_int64(token.value);
  if (!value) throw InvalidArgument(token.key, token.value, "an integer");
  return *value;
}

AttentionSpec build_full_form(AttentionSpec spec, const GivenKeys& given, const std::vector<Token>& short_tokens) {
  if (!short_tokens.empty()) {
    const Token& mixed = short_tokens.front();
    throw InvalidArgument(mixed.key, mixed.value,
                          "a layout-form key, which cannot be mixed with full tensor descriptors (q=, k=, v=, o=): "
                          "use one form or the other");
  }
  for (const char* name : {"q", "k", "v", "o"}) {
    if (!given.find(name)) throw InvalidArgument(name, "(missing)", "the tensor form needs all of q, k, v and o");
  }
  return spec;
}

// Layout and dtype default to bshd and bf16 so that "b=2 s=1024 h=16 d=128 causal" works on the
// command line; printing always writes both, so logged strings never depend on the defaults.
AttentionSpec build_short_form(AttentionSpec spec, const GivenKeys& given) {
  Layout layout = Layout::bshd;
  if (const Token* token = given.find("layout")) layout = parse_layout(token->value, token->key);
  ProblemShape shape;
  shape.dtype = DType::bf16;
  if (const Token* token = given.find("dtype")) shape.dtype = parse_dtype(token->value, token->key);
  for (const SizeKey& size : kSizeKeys) {
    const Token* token = given.find_size(size.key);
    if (!token) {
      throw InvalidArgument(size.key, "(missing)",
                            "the layout form needs b, s_q, s_kv, h_q, h_kv, d_qk and d_v (or the shorthands s, h, d)");
    }
    shape.*size.member = parse_size(*token);
  }
  for (const SizeKey& size : kPageKeys) {
    const Token* token = given.find(size.key);
    if (!paged_kv(layout)) {
      if (token) {
        throw InvalidArgument(token->key, token->value, "a paged layout (" + std::string(size.key) + " sizes its pages)");
      }
      continue;
    }
    if (!token) throw InvalidArgument(size.key, "(missing)", "page_size and pages with a paged layout");
    shape.*size.member = parse_size(*token);
  }
  LayoutTensors tensors = make_layout(layout, shape);
  spec.q = tensors.q;
  spec.k = tensors.k;
  spec.v = tensors.v;
  spec.o = tensors.o;
  // A ragged or paged layout's lengths are runtime data, so it implies padding unless told otherwise
  // (and validate() then says why padding=0 cannot be).
  if ((ragged_q(layout) || ragged_kv(layout) || paged_kv(layout)) && !given.find("padding")) spec.padding = true;
  if (paged_kv(layout)) {
    if (const Token* token = given.find("kv_pages")) {
      throw InvalidArgument(token->key, token->value, "no kv_pages with a paged layout's short form (s_kv / page_size)");
    }
    spec.kv_pages = shape.seq_kv / shape.page_size;
  }
  return spec;
}

// --- validation helpers ----------------------------------------------------------------------------

// validate() runs on every one-call forward/backward, so on success it must not allocate:
// names are plain pointers and messages are built only when a check fails.
struct NamedTensor {
  const char* name;
  const TensorDesc* desc;
};

std::array<NamedTensor, 4> tensors_of(const AttentionSpec& spec) {
  return {{{"q", &spec.q}, {"k", &spec.k}, {"v", &spec.v}, {"o", &spec.o}}};
}

void require_equal(const char* field, std::int64_t seen, const char* tensor, const char* what, std::int64_t wanted) {
  if (seen != wanted) {
    throw InvalidArgument(field, std::to_string(seen), std::string(tensor) + what + " (" + std::to_string(wanted) + ")");
  }
}

void require_multiple_of_8(const char* field, std::int64_t head_dim) {
  if (head_dim % 8 != 0) {
    throw InvalidArgument(field, std::to_string(head_dim),
                          "a multiple of 8 (cuDNN reads rows of 16-byte vectors of f16/bf16)");
  }
}

// An output must not alias itself: two (b, h, s, d) positions sharing an address would race.
// A simple sufficient test, exact for every named layout and for padded or permuted outputs: sort
// the axes by stride; each stride must reach past the whole block spanned by the faster axes, i.e.
// be at least the previous stride times the previous axis's size. Size-1 axes never step, so they
// are left out (their stride is arbitrary and would otherwise break ties wrongly).
void require_no_self_overlap(const char* name, const TensorDesc& desc) {
  std::array<std::pair<std::int64_t, std::int64_t>, 4> axes;  // (stride, dim)
  std::size_t count = 0;
  for (std::size_t i = 0; i < desc.dims.size(); ++i) {
    // A ragged batch has no stride: its sequences are placed apart by the runtime offsets.
    if (desc.dims[i] > 1 && !(i == kBatch && desc.ragged())) axes[count++] = {desc.strides[i], desc.dims[i]};
  }
  std::sort(axes.begin(), axes.begin() + count);
  for (std::size_t i = 1; i < count; ++i) {
    if (axes[i].first < axes[i - 1].first * axes[i - 1].second) {
      throw InvalidArgument(std::string(name) + ".strides", detail::format_list(desc.strides),
                            "strides that give every element its own address (sorted by stride, each stride at least "
                            "the previous stride times its dim): an output must not overlap itself");
    }
  }
}

}  // namespace

const char* to_string(Alignment alignment) noexcept { return name_of(alignment); }
const char* to_string(Bias bias) noexcept { return name_of(bias); }
const char* to_string(Softmax softmax) noexcept { return name_of(softmax); }
const char* to_string(MaxLogit max_logit) noexcept { return name_of(max_logit); }
const char* to_string(Fp8Scaling fp8_scaling) noexcept { return name_of(fp8_scaling); }
const char* to_string(Fp8Gradients fp8_gradients) noexcept { return name_of(fp8_gradients); }

// 2 matmuls (Q·K^T with d_qk, P·V with d_v) of 2 flops per multiply-add: 2·b·h·s_q·s_kv·(d_qk + d_v),
// which is 4·b·h·s_q·s_kv·d for d the mean head dim. Causal halving is the usual approximation (it
// ignores the diagonal, and with bottom-right alignment and s_q != s_kv the true fraction differs).
double AttentionSpec::forward_flops() const noexcept {
  double pairs = static_cast<double>(seq_q()) * static_cast<double>(seq_kv());
  if (window.causal()) {
    pairs /= 2.0;
  } else if (window.bounded()) {
    pairs = 0.0;
    for (std::int64_t i = 0; i < seq_q(); ++i) {
      pairs += static_cast<double>(
          detail::visible_keys(window.left, window.right, alignment == Alignment::bottom_right, seq_q(), seq_kv(), i)
              .size());
    }
  }
  return 4.0 * static_cast<double>(batch()) * static_cast<double>(heads_q()) * pairs *
         static_cast<double>(head_dim_qk() + head_dim_v()) / 2.0;
}

bool operator==(const AttentionSpec& a, const AttentionSpec& b) noexcept {
  bool equal = true;
  visit_fields([&](const char*, Reads, const auto& x, const auto& y) { equal = equal && x == y; }, a, b);
  return equal;
}

std::size_t hash_value(const AttentionSpec& spec) noexcept {
  std::size_t seed = 0;
  visit_fields([&](const char*, Reads, const auto& field) { detail::hash_combine(seed, hash_of(field)); }, spec);
  return seed;
}

namespace {

// Appends "name=value" for each option of `spec` that differs from `defaults` (the parser starts
// from the same defaults, so the string stays an exact repro while saying only what differs from
// plain attention), and for the four tensors too when `with_tensors`.
void append_fields(std::string& out, const AttentionSpec& spec, const AttentionSpec& defaults, bool with_tensors) {
  visit_fields(
      [&](const char* name, Reads, const auto& field, const auto& default_value) {
        if (kIsTensor<decltype(field)> ? !with_tensors : field == default_value) return;
        if (!out.empty()) out += ' ';
        out += std::string(name) + "=" + format_value(field);
      },
      spec, defaults);
}

}  // namespace

std::string to_string(const AttentionSpec& spec) {
  std::optional<Layout> layout = named_layout(spec);
  std::string out = layout ? short_form(*layout, problem_shape(spec)) : std::string();
  AttentionSpec defaults;
  // A ragged or paged layout implies padding (the parser sets it), so there "padding=0" is what
  // differs; a paged layout's sizes already say kv_pages.
  if (layout && (ragged_q(*layout) || ragged_kv(*layout) || paged_kv(*layout))) defaults.padding = true;
  if (layout && paged_kv(*layout)) defaults.kv_pages = spec.kv_pages;
  append_fields(out, spec, defaults, /*with_tensors=*/!layout);  // a layout form already says the tensors
  return out;
}

AttentionSpec parse_spec(const std::string& text) {
  AttentionSpec spec;
  GivenKeys given;
  bool any_tensor = false;
  std::vector<Token> short_tokens;  // layout-form keys, in order, to name the first one if mixed
  bool causal = false;
  for (const Token& token : tokenize(text)) {
    // "causal" is no field of its own: it closes the window's right side (causal_window), after
    // every token, so "causal window=W,-1" is the causal sliding window W,0 in any order.
    if (token.key == "causal") {
      if (token.value != "0" && token.value != "1") throw InvalidArgument("causal", token.value, "0 or 1");
      given.claim(token, token.key);
      causal = token.value == "1";
      continue;
    }
    bool is_field = false;
    visit_fields(
        [&](const char* name, Reads, auto& field) {
          if (token.key != name) return;
          is_field = true;
          given.claim(token, token.key);
          parse_value(token.value, token.key, field);
          if (kIsTensor<decltype(field)>) any_tensor = true;
        },
        spec);
    if (is_field) continue;
    bool layout_key = token.key == "layout" || token.key == "dtype" || is_size_key(token.key) ||
                      is_shorthand(token.key) || is_page_key(token.key);
    if (token.key.empty()) throw InvalidArgument("spec", "=" + token.value, "KEY=VALUE with a key before the '='");
    if (!layout_key) throw InvalidArgument(token.key, token.value, "a known key; " + known_keys());
    given.claim(token, token.key);
    short_tokens.push_back(token);
  }
  if (causal) spec.window = causal_window(spec.window);
  return any_tensor ? build_full_form(spec, given, short_tokens) : build_short_form(spec, given);
}

void validate(const AttentionSpec& spec) {
  const std::array<NamedTensor, 4> tensors = tensors_of(spec);
  for (const NamedTensor& t : tensors) {
    for (std::int64_t dim : t.desc->dims) {
      if (dim <= 0) throw InvalidArgument(std::string(t.name) + ".dims", detail::format_list(t.desc->dims), "every dim positive");
    }
  }
  // q, k and v share one dtype; so does o, except that an FP8 call may write O in any dtype (the
  // support policy says which cuDNN takes on which GPU), and an FP8 K/V cache has E4M3 k and v
  // beside 16-bit q and o (spec.h's fp8_kv_cache).
  for (const NamedTensor& t : tensors) {
    const bool fp8_output = t.desc == &spec.o && is_fp8(spec.q.dtype);
    const bool fp8_cache = (t.desc == &spec.k || t.desc == &spec.v) && !is_fp8(spec.q.dtype) && is_fp8(t.desc->dtype);
    if (fp8_cache && t.desc->dtype != DType::e4m3) {
      throw InvalidArgument(std::string(t.name) + ".dtype", to_string(t.desc->dtype),
                            std::string("the dtype of q (") + to_string(spec.q.dtype) +
                                "), or e4m3 for an FP8 K/V cache beside it");
    }
    if (t.desc->dtype != spec.q.dtype && !fp8_output && !fp8_cache) {
      throw InvalidArgument(std::string(t.name) + ".dtype", to_string(t.desc->dtype),
                            std::string("the dtype of q (") + to_string(spec.q.dtype) + "): q, k, v and o share one" +
                                (is_fp8(spec.q.dtype) ? "" : " (k and v may be e4m3 together: an FP8 K/V cache)"));
    }
  }
  if (spec.k.dtype != spec.v.dtype) {
    throw InvalidArgument("v.dtype", to_string(spec.v.dtype),
                          std::string("the dtype of k (") + to_string(spec.k.dtype) + "): an FP8 K/V cache has both");
  }
  if (spec.fp8_scaling == Fp8Scaling::head && !spec.fp8_kv_cache()) {
    throw InvalidArgument("fp8_scaling", "head",
                          std::string("an FP8 K/V cache (e4m3 k and v beside f16 or bf16 q) for per-head descales; "
                                      "q is ") + to_string(spec.q.dtype) + ", k " + to_string(spec.k.dtype));
  }
  if (spec.kv_pages < 0) throw InvalidArgument("kv_pages", std::to_string(spec.kv_pages), "0 (not paged) or a page count");
  for (const NamedTensor& t : tensors) {
    const bool pool = spec.paged_kv() && (t.desc == &spec.k || t.desc == &spec.v);  // pages, not sequences
    if (!pool) require_equal("b", t.desc->batch(), t.name, "'s batch equal to q's", spec.batch());
  }
  if (spec.paged_kv() && spec.k.batch() != spec.v.batch()) {
    throw InvalidArgument("v.dims", detail::format_list(spec.v.dims), "as many pages in v's pool as in k's");
  }

  require_equal("h_kv", spec.v.heads(), "v", "'s heads equal to k's", spec.k.heads());
  if (spec.heads_q() % spec.heads_kv() != 0) {
    throw InvalidArgument("h_q", std::to_string(spec.heads_q()),
                          "a multiple of h_kv = " + std::to_string(spec.heads_kv()) + " (GQA/MQA)");
  }
  require_equal("s_kv", spec.v.seq(), "v", "'s sequence length equal to k's", spec.k.seq());
  require_equal("d_qk", spec.k.head_dim(), "k", "'s head dim equal to q's", spec.q.head_dim());
  const std::array<std::int64_t, 4> o_dims{spec.batch(), spec.heads_q(), spec.seq_q(), spec.head_dim_v()};
  if (spec.o.dims != o_dims) {
    throw InvalidArgument("o.dims", detail::format_list(spec.o.dims), "[b, h_q, s_q, d_v] = " + detail::format_list(o_dims));
  }
  require_multiple_of_8("d_qk", spec.head_dim_qk());
  require_multiple_of_8("d_v", spec.head_dim_v());

  for (const NamedTensor& t : tensors) {
    auto fail = [&](const char* requirement) {
      throw InvalidArgument(std::string(t.name) + ".strides", detail::format_list(t.desc->strides), requirement);
    };
    for (int axis = 0; axis < 4; ++axis) {
      if (axis == kBatch && t.desc->strides[axis] == 0) continue;  // ragged: placed by runtime offsets
      if (t.desc->strides[axis] <= 0) fail("every stride positive (a batch stride of 0 makes a tensor ragged)");
    }
    if (t.desc->strides[kDim] != 1) fail("a head-dim (innermost) stride of 1");
  }
  require_no_self_overlap("o", spec.o);
  if (spec.o.ragged() != spec.q.ragged()) {
    throw InvalidArgument("o.strides", detail::format_list(spec.o.strides),
                          std::string("o ragged exactly when q is (batch stride 0), and q is ") +
                              (spec.q.ragged() ? "ragged" : "not"));
  }
  if (spec.v.ragged() != spec.k.ragged()) {
    throw InvalidArgument("v.strides", detail::format_list(spec.v.strides),
                          std::string("v ragged exactly when k is (batch stride 0), and k is ") +
                              (spec.k.ragged() ? "ragged" : "not"));
  }
  if ((spec.ragged_q() || spec.ragged_kv()) && !spec.padding) {
    throw InvalidArgument("padding", "0", "padding=1 with ragged tensors: their lengths come at run time");
  }
  if (spec.paged_kv() && !spec.padding) {
    throw InvalidArgument("padding", "0", "padding=1 with paged caches: their lengths come at run time");
  }
  if (spec.paged_kv() && spec.ragged_kv()) {
    throw InvalidArgument("kv_pages", std::to_string(spec.kv_pages), "dense page pools (k and v with a batch stride)");
  }
  // A left bound of 0 would hide every key, including the diagonal's own.
  if (spec.window.left < -1 || spec.window.left == 0) {
    throw InvalidArgument("window", format_value(spec.window), "a left bound of -1 (none) or at least 1 key");
  }
  if (spec.window.right < -1) {
    throw InvalidArgument("window", format_value(spec.window), "a right bound of -1 (none) or at least 0");
  }
  if (!(spec.dropout >= 0.0 && spec.dropout < 1.0)) {
    throw InvalidArgument("dropout", format_value(spec.dropout), "a probability in [0, 1)");
  }
  if (spec.dropout_mask_out && spec.dropout == 0.0) {
    throw InvalidArgument("dropout_mask_out", "1", "dropout > 0 (there is no mask without dropout)");
  }
  if (spec.bias_grad && spec.bias == Bias::none) {
    throw InvalidArgument("bias_grad", "1", "a bias (bias=bhss, b1ss, 1hss, 11ss or 111s) to take the gradient of");
  }
  // Block scales need no head-dim multiple of 32: the last block of a row may be short (mxfp8.h).
  if (spec.fp8_scaling == Fp8Scaling::mxfp8 && !is_fp8(spec.q.dtype)) {
    throw InvalidArgument("fp8_scaling", "mxfp8",
                          std::string("FP8 q, k and v (dtype=e4m3 or e5m2) for MXFP8 block scaling; q is ") +
                              to_string(spec.q.dtype));
  }
  if (spec.fp8_gradients == Fp8Gradients::e5m2 && spec.q.dtype != DType::e4m3) {
    throw InvalidArgument("fp8_grads", "e5m2",
                          std::string("E4M3 q, k and v (dtype=e4m3) for E5M2 gradients (E5M2 inputs have them "
                                      "already, 16-bit inputs have no FP8 backward); q is ") +
                              to_string(spec.q.dtype));
  }
  // cuDNN's MXFP8 graphs write O and the gradients with plain matrix products, which take no
  // output scale: an FP8 O could not be written at all. No GPU or cuDNN version lifts that, so it is
  // a contradiction in the spec (here) rather than a support limit (the policy's reasons).
  if (spec.fp8_scaling == Fp8Scaling::mxfp8 && is_fp8(spec.o.dtype)) {
    throw InvalidArgument("o.dtype", to_string(spec.o.dtype),
                          "f16 or bf16 with fp8_scaling=mxfp8 (cuDNN's MXFP8 attention writes O unscaled): "
                          "write o in full, o=bf16[b,h_q,s_q,d_v]/[strides]");
  }
  if (spec.fp8_scaling == Fp8Scaling::mxfp8 && spec.fp8_gradients == Fp8Gradients::e5m2) {
    throw InvalidArgument("fp8_grads", "e5m2",
                          "as_inputs with fp8_scaling=mxfp8 (its dO, dQ, dK and dV are 16-bit, in o's dtype)");
  }
}

ValidatedSpec::ValidatedSpec(AttentionSpec spec) : AttentionSpec(std::move(spec)) { validate(*this); }

DType gradient_dtype(const AttentionSpec& spec) noexcept {
  if (spec.fp8_scaling == Fp8Scaling::mxfp8) return spec.o.dtype;  // validate(): 16-bit
  return spec.fp8_gradients == Fp8Gradients::e5m2 ? DType::e5m2 : spec.q.dtype;
}

TensorDesc gradient_desc(const TensorDesc& desc, const AttentionSpec& spec) noexcept {
  TensorDesc out = desc;
  out.dtype = gradient_dtype(spec);
  return out;
}

namespace detail {

void reset_unread_fields(AttentionSpec& spec, Pass pass) {
  const unsigned reader = pass == Pass::forward ? kForwardReads : kBackwardReads;
  const AttentionSpec defaults;
  visit_fields(
      [&](const char*, Reads reads, auto& field, const auto& default_value) {
        if (!(reads & reader)) field = default_value;
      },
      spec, defaults);
}

namespace {

AttentionSpec with_options(const AttentionOptions& options) {
  AttentionSpec spec;
  static_cast<AttentionOptions&>(spec) = options;
  return spec;
}

}  // namespace

void parse_option(AttentionOptions& options, const std::string& key, const std::string& text) {
  AttentionSpec spec = with_options(options);
  bool found = false;
  visit_fields(
      [&](const char* name, Reads, auto& field) {
        if (kIsTensor<decltype(field)> || key != name) return;
        found = true;
        parse_value(text, key, field);
      },
      spec);
  if (!found) throw InvalidArgument(key, text, "an option key; " + known_keys());
  options = spec;
}

bool same_options(const AttentionOptions& a, const AttentionOptions& b) noexcept {
  return with_options(a) == with_options(b);
}

std::string options_text(const AttentionOptions& options) {
  std::string out;
  append_fields(out, with_options(options), AttentionSpec(), /*with_tensors=*/false);
  return out;
}

}  // namespace detail

}  // namespace fusedattn
