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
#include "fusedattn/options.h"
#include "fusedattn/tensor.h"

namespace fusedattn {

/// What to compute: the four tensors and the options (AttentionOptions, fusedattn/options.h). The
/// attention scale is deliberately absent: it is a runtime value, so one compiled plan serves every scale.
struct AttentionSpec : AttentionOptions {
  TensorDesc q, k, v;  ///< inputs; q is [b, h_q, s_q, d_qk], k [b, h_kv, s_kv, d_qk], v [b, h_kv, s_kv, d_v]
  TensorDesc o;        ///< output [b, h_q, s_q, d_v]; its gradient dO shares this descriptor (in the
                       ///< gradients' dtype, gradient_desc())

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
  /// An FP8 K/V cache beside 16-bit queries: k and v in E4M3, q and o in f16 or bf16, dequantized
  /// by descale_k and descale_v (fp8_scales.h; per tensor, or per K/V head with fp8_scaling=head).
  /// Only fusedattn's own decode kernel runs it (the support policy says where).
  bool fp8_kv_cache() const noexcept { return is_fp8(k.dtype) && !is_fp8(q.dtype); }

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

/// The dtype of the backward's dO and gradients dQ, dK, dV: q's, or E5M2 where the spec's
/// fp8_gradients asks for it (E4M3 inputs, the hybrid recipe), or o's 16-bit dtype for MXFP8
/// (whose FP8 dO comes beside the 16-bit one: fusedattn/mxfp8_scales.h).
DType gradient_dtype(const AttentionSpec& spec) noexcept;
/// `desc` (o, q, k or v) with the gradients' dtype: the descriptor of dO, dQ, dK or dV.
TensorDesc gradient_desc(const TensorDesc& desc, const AttentionSpec& spec) noexcept;

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

/// A spec that validate() accepted, unchangeable from then on: the proof that lets a call check
/// its spec once. get_plan and check_support (fusedattn/attention.h) take it without validating
/// again, while their forms on a plain AttentionSpec validate first, so no spec reaches the plan
/// cache unchecked. Only validation makes one: this constructor, or make_spec (fusedattn/call.h).
/// The spec is a private base, read through spec(), so no field can change after the check (a base
/// rather than a member so that the Python module can offer it as a read-only Spec).
class ValidatedSpec : private AttentionSpec {
 public:
  /// Validates `spec` (InvalidArgument naming the field) and keeps it.
  explicit ValidatedSpec(AttentionSpec spec);
  const AttentionSpec& spec() const noexcept { return *this; }
};

}  // namespace fusedattn

template <>
struct std::hash<fusedattn::AttentionSpec> {
  std::size_t operator()(const fusedattn::AttentionSpec& spec) const noexcept { return fusedattn::hash_value(spec); }
};
