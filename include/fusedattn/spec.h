// fusedattn/spec.h — AttentionSpec: what one attention call computes, independent of any framework.
//
// The spec is the cache key's heart and the unit of every error message: it prints as a one-line
// string that `fusedattn run "<spec>"` accepts back. Equality, hashing, printing and parsing all
// come from one field list (visit_fields in spec.cpp), so they cannot disagree.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "fusedattn/layout.h"
#include "fusedattn/tensor.h"

namespace fusedattn {

/// Where the causal diagonal starts: row 0 sees key 0 (top-left), or the last row sees the last
/// key (bottom-right, the usual choice for decoding with a KV cache when s_q < s_kv).
enum class Alignment : std::uint8_t { top_left, bottom_right };

const char* to_string(Alignment alignment) noexcept;

/// Which keys each query sees, around its diagonal position p (p = i top-left, p = i + s_kv - s_q
/// bottom-right): key j is visible when p - left < j <= p + right. A bound of -1 is no bound on
/// that side. {-1, -1} is no mask, {-1, 0} causal, {W, 0} a causal sliding window of W keys
/// (the diagonal included), {W, R} a band that also looks R keys ahead.
struct Window {
  std::int64_t left = -1;
  std::int64_t right = -1;

  bool bounded() const noexcept { return left >= 0 || right >= 0; }
  bool causal() const noexcept { return left < 0 && right == 0; }
  friend bool operator==(const Window& a, const Window& b) noexcept { return a.left == b.left && a.right == b.right; }
  friend bool operator!=(const Window& a, const Window& b) noexcept { return !(a == b); }
};

/// "LEFT,RIGHT", as the spec string writes it ("-1,0" for causal).
std::string to_string(const Window& window);

/// The causal window {-1, 0}.
constexpr Window kCausal{-1, 0};

/// Which dims of the post-scale bias [b, h, s_q, s_kv] are real (the others broadcast, size 1).
/// The bias tensor is contiguous in its own shape and has q's dtype; it is added to the scaled
/// scores before the mask and the softmax.
enum class Bias : std::uint8_t { none, bhss, b1ss, one_hss, one_1ss, one_11s };
const char* to_string(Bias bias) noexcept;  ///< "none", "bhss", "b1ss", "1hss", "11ss", "111s"

/// Dims of the bias tensor of `bias` kind for these sizes: [b or 1, h or 1, s_q or 1, s_kv]
/// (all zero for Bias::none).
std::array<std::int64_t, 4> bias_dims(Bias bias, std::int64_t batch, std::int64_t heads, std::int64_t seq_q,
                                      std::int64_t seq_kv) noexcept;

/// The softmax's denominator: vanilla sum_j e^s_ij; off_by_one adds e^0 (a zero logit that takes
/// probability mass); sink adds e^sink_h, a learnable per-head logit (float32 [h], with a gradient).
enum class Softmax : std::uint8_t { vanilla, off_by_one, sink };
const char* to_string(Softmax softmax) noexcept;

/// The largest logit (scaled score after bias and mask) per query row, or reduced to one value per
/// head over the batch and every valid row.
enum class MaxLogit : std::uint8_t { none, row, head };
const char* to_string(MaxLogit max_logit) noexcept;

/// What to compute. The attention scale is deliberately absent: it is a runtime value, so one
/// compiled plan serves every scale.
struct AttentionSpec {
  TensorDesc q, k, v;  ///< inputs; q is [b, h_q, s_q, d_qk], k [b, h_kv, s_kv, d_qk], v [b, h_kv, s_kv, d_v]
  TensorDesc o;        ///< output [b, h_q, s_q, d_v]; its gradient dO shares this descriptor
  Window window;                              ///< which keys each query sees (default: all)
  Alignment alignment = Alignment::top_left;  ///< where the diagonal starts (matters only with a bound)
  Bias bias = Bias::none;       ///< a post-scale bias tensor and which of its dims broadcast
  bool bias_grad = false;       ///< backward also writes dBias (in the bias's own shape)
  bool alibi = false;           ///< add ALiBi with the standard per-head slopes (needs a causal window)
  Softmax softmax = Softmax::vanilla;
  MaxLogit max_logit = MaxLogit::none;
  double dropout = 0.0;  ///< probability of dropping each attention probability (Philox, seed and offset
                         ///< read from device memory at run time); 0 = no dropout
  bool dropout_mask_out = false;  ///< forward also writes the keep mask it drew (float32 [b, h_q, s_q,
                                  ///< s_kv], 0 or 1), for checking and debugging
  bool padding = false;  ///< per-batch lengths come at run time (seq_len_q, seq_len_kv in the tensor
                         ///< sets); rows and keys past them are padding, and O, dQ, dK, dV are zero there
  bool deterministic = false;  ///< backward: bitwise-reproducible dQ, dK, dV (no atomic accumulation)
  bool stats = true;  ///< also write the softmax statistics (log-sum-exp, float32 [b, h_q, s_q, 1]),
                      ///< which the backward pass needs; inference may turn them off
  std::int64_t kv_pages = 0;  ///< > 0: K and V are paged caches, k and v describe their pools of
                              ///< pages [pages, h_kv, page_size, d], and each sequence has kv_pages
                              ///< pages in its page table (layout.h paged_kv); 0: not paged

  std::int64_t batch() const noexcept { return q.batch(); }
  std::int64_t heads_q() const noexcept { return q.heads(); }
  std::int64_t heads_kv() const noexcept { return k.heads(); }
  std::int64_t seq_q() const noexcept { return q.seq(); }
  std::int64_t seq_kv() const noexcept { return paged_kv() ? kv_pages * k.seq() : k.seq(); }
  std::int64_t head_dim_qk() const noexcept { return q.head_dim(); }
  std::int64_t head_dim_v() const noexcept { return v.head_dim(); }
  /// Ragged Q (and O) / K and V: see TensorDesc::ragged(). Ragged specs need padding = true.
  bool ragged_q() const noexcept { return q.ragged(); }
  bool ragged_kv() const noexcept { return k.ragged(); }
  /// Paged K/V caches: the longest sequence is kv_pages pages of page_size() tokens.
  bool paged_kv() const noexcept { return kv_pages > 0; }
  std::int64_t page_size() const noexcept { return paged_kv() ? k.seq() : 0; }

  /// Multiply-add work of the forward pass, in floating-point operations, by the usual convention:
  /// 4·b·h·(visible pairs)·d, with d the mean of d_qk and d_v, where a causal mask counts as half of
  /// s_q·s_kv (as the benchmarks everyone quotes do) and another window counts its pairs exactly.
  double forward_flops() const noexcept;

  friend bool operator==(const AttentionSpec& a, const AttentionSpec& b) noexcept;
  friend bool operator!=(const AttentionSpec& a, const AttentionSpec& b) noexcept { return !(a == b); }
};

/// The one-line form. When all four tensors are exactly what a named layout gives, it is written
/// as "layout=NAME b=.. s_q=.. ..." (short, readable); otherwise each tensor is written in full.
std::string to_string(const AttentionSpec& spec);

/// Parses the one-line form (either variant). Throws InvalidArgument naming the field on any
/// unknown key, malformed value or missing size. Does not validate; call validate() for that.
AttentionSpec parse_spec(const std::string& text);

/// A spec whose four tensors are `layout`'s for `shape` (other fields at their defaults, except
/// that a ragged or paged layout sets padding, its lengths coming at run time, and a paged one
/// sets kv_pages = s_kv / page_size).
/// Throws InvalidArgument where the layout cannot pack the shape (see make_layout).
AttentionSpec spec_for_layout(Layout layout, const ProblemShape& shape);

/// The bias tensor of `spec` (q's dtype, contiguous in its broadcast shape); dBias shares it.
TensorDesc bias_desc(const AttentionSpec& spec);

/// The sizes of `spec` (batch, lengths, heads, head dims, dtype of q).
ProblemShape problem_shape(const AttentionSpec& spec);

/// The first named layout whose four descriptors are exactly the spec's, if there is one.
std::optional<Layout> named_layout(const AttentionSpec& spec);

/// Hash over every field of the spec (the same list that drives equality).
std::size_t hash_value(const AttentionSpec& spec) noexcept;

/// Rejects bad input before any GPU work: InvalidArgument naming the field, the value seen and
/// the requirement. Checks shapes that must agree (batch, heads, dims, dtypes), GQA divisibility,
/// head dims (positive multiples of 8), positive sizes, unit innermost strides and outputs that
/// would overlap themselves.
void validate(const AttentionSpec& spec);

}  // namespace fusedattn

template <>
struct std::hash<fusedattn::AttentionSpec> {
  std::size_t operator()(const fusedattn::AttentionSpec& spec) const noexcept { return fusedattn::hash_value(spec); }
};
