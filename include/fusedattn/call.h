// fusedattn/call.h — the adapter boundary: a call's tensors as a framework holds them, plus one
// frozen configuration of its options, turned into the validated spec by the core alone.
//
// Every adapter (PyTorch, JAX, and the C++ fast paths inside them) goes through these functions,
// so each check is written once, here or in validate(), and a bad call gets the same message
// from every entry point. The adapters' keyword arguments are set by their spec-string names
// (make_call_config), through the same field codecs as the CLI's parser.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fusedattn/options.h"
#include "fusedattn/spec.h"
#include "fusedattn/tensor.h"

namespace fusedattn {

/// How a framework tensor's axes map onto the logical [b, h, s, d]: the letters name the axes in
/// the tensor's own order; thd is a ragged [tokens, h, d] tensor whose sequences are placed by
/// cumulative offsets at run time.
enum class AxisOrder : std::uint8_t { bshd, sbhd, bhsd, thd };
const char* to_string(AxisOrder order) noexcept;
/// Parses "bshd", "sbhd", "bhsd" or "thd"; InvalidArgument naming `field` otherwise.
AxisOrder parse_axis_order(const std::string& text, const std::string& field);
/// Per dense axis order, the tensor axis that holds each logical axis (batch, heads, sequence, head
/// dim); thd answers bshd's, which its [t, h, d] does not follow (check for thd first).
std::array<int, 4> axes_of(AxisOrder order) noexcept;

/// A framework tensor before it has a layout: element type, sizes and element strides in the
/// tensor's own axis order (rank 4, or 3 for thd).
struct TensorView {
  DType dtype = DType::bf16;
  int rank = 0;
  std::array<std::int64_t, 4> sizes{};
  std::array<std::int64_t, 4> strides{};
};

/// The frozen configuration of a call: how its tensors' axes map, and every option.
struct CallConfig {
  AxisOrder layout = AxisOrder::bshd;     ///< q and o
  AxisOrder kv_layout = AxisOrder::bshd;  ///< k and v; for paged caches (options.kv_pages > 0) the pools'
  AttentionOptions options;
};

/// A config from the adapters' terms: layouts by name and options as (spec-string key, text)
/// pairs (window "-1,0", align "bottom_right", bias "11ss", dropout "0.1", ...), parsed with the
/// spec parser's own messages. The key "causal" with "1" applies causal_window (options.h) after
/// every other option, as the spec parser does: window=(W, -1) or (W, 0) with causal is the causal
/// sliding window (W, 0), and a window with a right bound of 1 or more is refused. Throws
/// InvalidArgument naming the key.
CallConfig make_call_config(const std::string& layout, const std::string& kv_layout,
                            const std::vector<std::pair<std::string, std::string>>& options);

/// The options as the spec string writes them (those at their defaults left out), after
/// "layout=NAME" (and "kv_layout=NAME" where it differs).
std::string to_string(const CallConfig& config);

/// Parses what to_string(CallConfig) prints back into the config (the form compiled programs
/// carry, since config ids are only valid in the process that made them).
CallConfig parse_call_config(const std::string& text);

bool operator==(const CallConfig& a, const CallConfig& b) noexcept;
inline bool operator!=(const CallConfig& a, const CallConfig& b) noexcept { return !(a == b); }

/// What the tensors of one call are: q, k, v as the framework holds them (for paged caches k and v
/// are the page pools), and for thd the sequence count and longest sequences (the plan's bucket
/// comes from these; they are host values, as varlen APIs take them).
struct CallShape {
  TensorView q, k, v;
  std::int64_t sequences = 0;
  std::int64_t max_seq_q = 0;
  std::int64_t max_seq_kv = 0;
};

/// The logical descriptor of `view` in `order` ("q", "k", ... name it in errors); thd gets
/// `sequences` sequences of up to `max_seq` tokens and a batch stride of 0.
TensorDesc describe(const TensorView& view, AxisOrder order, std::int64_t sequences, std::int64_t max_seq,
                    const char* name);

/// The validated spec of a call: q, k, v described in the config's axis orders, o as the adapters
/// allocate it (q's sizes with v's head dim, dense in q's axis order). Throws InvalidArgument
/// naming the tensor and field (fusedattn/spec.h validate()). Hand the result to get_plan or
/// check_support as it is: they do not validate a ValidatedSpec again.
ValidatedSpec make_spec(const CallConfig& config, const CallShape& shape);

/// The bias kind of a post-scale bias tensor of `bias`'s sizes beside q and k of `shape`:
/// [b|1, h_q|1, s_q|1, s_kv] in logical order (a size-1 dim broadcasts), in q's dtype; for thd
/// tensors b and s are `shape`'s sequences and longest lengths. Throws InvalidArgument
/// ("bias.shape", "bias.dtype") otherwise.
Bias bias_kind(const TensorView& bias, const CallConfig& config, const CallShape& shape);

/// Names a config by a small integer for the adapters' hot paths (their C++ code receives the
/// id, not the options). The same config always gets the same id; ids live as long as the
/// process. At most kMaxRegisteredConfigs distinct configs: past that, InvalidArgument.
int register_config(const CallConfig& config);
/// The config of `id`; InvalidArgument for an id register_config() did not give.
const CallConfig& registered_config(int id);
constexpr int kMaxRegisteredConfigs = 4096;

}  // namespace fusedattn
