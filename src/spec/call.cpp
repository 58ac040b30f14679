// The adapter boundary: framework tensors and a frozen config of options into the validated spec.
#include "fusedattn/call.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <utility>

#include "fusedattn/errors.h"
#include "spec/fields.h"
#include "spec/text.h"

namespace fusedattn {
namespace {

struct NamedOrder {
  AxisOrder order;
  const char* name;
};
constexpr NamedOrder kOrders[] = {
    {AxisOrder::bshd, "bshd"}, {AxisOrder::sbhd, "sbhd"}, {AxisOrder::bhsd, "bhsd"}, {AxisOrder::thd, "thd"}};

std::array<std::int64_t, 4> dense_strides(const std::array<std::int64_t, 4>& sizes, int rank) {
  std::array<std::int64_t, 4> strides{};
  std::int64_t step = 1;
  for (int axis = rank - 1; axis >= 0; --axis) {
    strides[axis] = step;
    step *= sizes[axis];
  }
  return strides;
}

std::string sizes_text(const TensorView& view) {
  std::array<std::int64_t, 4> sizes = view.sizes;
  std::string out = "[";
  for (int axis = 0; axis < view.rank; ++axis) out += (axis ? "," : "") + std::to_string(sizes[axis]);
  return out + "]";
}

// The default for q and o's sequences when a thd call does not say: the tokens it holds.
std::int64_t tokens(const TensorView& view) { return view.rank > 0 ? view.sizes[0] : 0; }

}  // namespace

std::array<int, 4> axes_of(AxisOrder order) noexcept {
  switch (order) {
    case AxisOrder::sbhd: return {1, 2, 0, 3};
    case AxisOrder::bhsd: return {0, 1, 2, 3};
    default: return {0, 2, 1, 3};
  }
}

const char* to_string(AxisOrder order) noexcept {
  for (const NamedOrder& entry : kOrders) {
    if (entry.order == order) return entry.name;
  }
  return "unknown";
}

AxisOrder parse_axis_order(const std::string& text, const std::string& field) {
  for (const NamedOrder& entry : kOrders) {
    if (text == entry.name) return entry.order;
  }
  throw InvalidArgument(field, text, "one of bshd, sbhd, bhsd, thd");
}

CallConfig make_call_config(const std::string& layout, const std::string& kv_layout,
                            const std::vector<std::pair<std::string, std::string>>& options) {
  CallConfig config;
  config.layout = parse_axis_order(layout, "layout");
  config.kv_layout = kv_layout.empty() ? config.layout : parse_axis_order(kv_layout, "kv_layout");
  bool causal = false;
  for (const auto& [key, text] : options) {
    if (key == "causal") {
      if (text != "0" && text != "1") throw InvalidArgument("causal", text, "0 or 1");
      causal = text == "1";
      continue;
    }
    detail::parse_option(config.options, key, text);
  }
  if (causal) config.options.window = causal_window(config.options.window);  // the spec parser's rule and words
  return config;
}

std::string to_string(const CallConfig& config) {
  std::string out = std::string("layout=") + to_string(config.layout);
  if (config.kv_layout != config.layout) out += std::string(" kv_layout=") + to_string(config.kv_layout);
  const std::string options = detail::options_text(config.options);
  return options.empty() ? out : out + " " + options;
}

CallConfig parse_call_config(const std::string& text) {
  std::string layout = "bshd", kv_layout;
  std::vector<std::pair<std::string, std::string>> options;
  for (std::size_t end = 0, start; (start = text.find_first_not_of(' ', end)) != std::string::npos;) {
    end = text.find(' ', start);
    const std::string word = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const std::size_t equals = word.find('=');
    if (equals == std::string::npos) throw InvalidArgument(word, "", "a key=value token of a config");
    std::string key = word.substr(0, equals), value = word.substr(equals + 1);
    if (key == "layout") {
      layout = value;
    } else if (key == "kv_layout") {
      kv_layout = value;
    } else {
      options.emplace_back(std::move(key), std::move(value));
    }
  }
  return make_call_config(layout, kv_layout, options);
}

bool operator==(const CallConfig& a, const CallConfig& b) noexcept {
  return a.layout == b.layout && a.kv_layout == b.kv_layout && detail::same_options(a.options, b.options);
}

TensorDesc describe(const TensorView& view, AxisOrder order, std::int64_t sequences, std::int64_t max_seq,
                    const char* name) {
  const int rank = order == AxisOrder::thd ? 3 : 4;
  if (view.rank != rank) {
    throw InvalidArgument(std::string(name) + ".shape", sizes_text(view),
                          std::to_string(rank) + " dims in layout " + to_string(order));
  }
  TensorDesc desc;
  desc.dtype = view.dtype;
  if (order == AxisOrder::thd) {  // [t, h, d]: sequences of up to max_seq tokens, placed by offsets
    desc.dims = {sequences, view.sizes[1], max_seq, view.sizes[2]};
    desc.strides = {0, view.strides[1], view.strides[0], view.strides[2]};
    return desc;
  }
  const std::array<int, 4> axes = axes_of(order);
  for (int logical = 0; logical < 4; ++logical) {
    desc.dims[logical] = view.sizes[axes[logical]];
    desc.strides[logical] = view.strides[axes[logical]];
  }
  return desc;
}

ValidatedSpec make_spec(const CallConfig& config, const CallShape& shape) {
  AttentionSpec spec;
  static_cast<AttentionOptions&>(spec) = config.options;
  const bool ragged_q = config.layout == AxisOrder::thd;
  const bool ragged_kv = config.kv_layout == AxisOrder::thd;
  const std::int64_t max_q = shape.max_seq_q > 0 ? shape.max_seq_q : tokens(shape.q);
  const std::int64_t max_kv = shape.max_seq_kv > 0 ? shape.max_seq_kv : tokens(shape.k);
  spec.q = describe(shape.q, config.layout, shape.sequences, max_q, "q");
  spec.k = describe(shape.k, config.kv_layout, shape.sequences, max_kv, "k");
  spec.v = describe(shape.v, config.kv_layout, shape.sequences, max_kv, "v");
  // O is q with v's head dim, allocated dense in q's own axis order.
  TensorView o = shape.q;
  o.sizes[o.rank - 1] = shape.v.rank > 0 ? shape.v.sizes[shape.v.rank - 1] : 0;
  o.strides = dense_strides(o.sizes, o.rank);
  spec.o = describe(o, config.layout, shape.sequences, max_q, "o");
  if ((ragged_q || ragged_kv) && shape.sequences <= 0) {
    throw InvalidArgument("sequences", std::to_string(shape.sequences),
                          "at least 1 with a thd layout (cu_seqlens of n + 1 offsets give n sequences)");
  }
  return ValidatedSpec(std::move(spec));
}

Bias bias_kind(const TensorView& bias, const CallConfig& config, const CallShape& shape) {
  if (bias.dtype != shape.q.dtype) {
    throw InvalidArgument("bias.dtype", to_string(bias.dtype),
                          std::string("q's dtype (") + to_string(shape.q.dtype) + "): the bias is added in q's type");
  }
  // Dense tensors ignore the sequence arguments; thd ones take the call's (at least 1 to be described).
  const std::int64_t max_q = std::max<std::int64_t>(shape.max_seq_q, 1);
  const std::int64_t max_kv = std::max<std::int64_t>(shape.max_seq_kv, 1);
  const TensorDesc q = describe(shape.q, config.layout, shape.sequences, max_q, "q");
  const TensorDesc k = describe(shape.k, config.kv_layout, shape.sequences, max_kv, "k");
  const std::int64_t b = q.batch(), h = q.heads(), s_q = q.seq(), s_kv = k.seq();
  const std::string wanted = "[b|1, h|1, s_q|1, s_kv] = [" + std::to_string(b) + "|1, " + std::to_string(h) + "|1, " +
                             std::to_string(s_q) + "|1, " + std::to_string(s_kv) + "]";
  const auto& n = bias.sizes;
  const bool fits = bias.rank == 4 && (n[0] == 1 || n[0] == b) && (n[1] == 1 || n[1] == h) &&
                    (n[2] == 1 || n[2] == s_q) && n[3] == s_kv;
  if (!fits) throw InvalidArgument("bias.shape", sizes_text(bias), wanted);
  // By which of (batch, heads, query rows) the bias has rather than broadcasts. A query axis of
  // length 1 is the whole axis when s_q is 1 (a decode step): [b, 1, 1, s_kv] there is a
  // per-entry row (b1ss), not a broadcast one; only [1, 1, 1, s_kv] stays the broadcast row 111s.
  const bool has_b = n[0] > 1, has_h = n[1] > 1;
  const bool has_s = n[2] > 1 || (s_q == 1 && (has_b || has_h));
  if (has_s && has_b && has_h) return Bias::bhss;
  if (has_s && has_b) return Bias::b1ss;
  if (has_s && has_h) return Bias::one_hss;
  if (has_s) return Bias::one_1ss;
  if (!has_b && !has_h) return Bias::one_11s;
  // Only s_q > 1 gets here: a batch or head axis over one broadcast query row, e.g. [b, h, 1, s_kv].
  const std::string rows = std::to_string(s_q), keys = std::to_string(s_kv);
  throw InvalidArgument("bias.shape", sizes_text(bias),
                        "one of [" + std::to_string(b) + "," + std::to_string(h) + "," + rows + "," + keys + "], [" +
                            std::to_string(b) + ",1," + rows + "," + keys + "], [1," + std::to_string(h) + "," +
                            rows + "," + keys + "], [1,1," + rows + "," + keys + "], [1,1,1," + keys +
                            "] (a bias with a batch or head axis has every query row: expand it to " + rows + ")");
}

namespace {

// Append-only, so references handed out stay valid; a deque never moves its elements.
struct ConfigRegistry {
  std::mutex mutex;
  std::deque<CallConfig> configs;
};

ConfigRegistry& registry() {
  static ConfigRegistry* instance = new ConfigRegistry();  // never destroyed: ids outlive static destructors
  return *instance;
}

}  // namespace

int register_config(const CallConfig& config) {
  ConfigRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    if (r.configs[i] == config) return static_cast<int>(i);
  }
  if (r.configs.size() >= static_cast<std::size_t>(kMaxRegisteredConfigs)) {
    throw InvalidArgument("config", to_string(config),
                          "at most " + std::to_string(kMaxRegisteredConfigs) +
                              " distinct option sets in one process (an option that changes on every call, such as "
                              "a window, belongs in a runtime tensor)");
  }
  r.configs.push_back(config);
  return static_cast<int>(r.configs.size() - 1);
}

const CallConfig& registered_config(int id) {
  ConfigRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (id < 0 || static_cast<std::size_t>(id) >= r.configs.size()) {
    throw InvalidArgument("config_id", std::to_string(id), "an id from register_config()");
  }
  return r.configs[static_cast<std::size_t>(id)];
}

}  // namespace fusedattn
