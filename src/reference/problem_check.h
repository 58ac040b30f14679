// Input checks shared by the CPU and GPU references: a bad problem must throw, not read out of bounds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/reference.h"

namespace fusedattn::detail {

inline void require_positive(const char* field, std::int64_t value) {
  if (value < 1) throw InvalidArgument(field, std::to_string(value), "must be at least 1");
}

/// Padding lengths: `lengths` must be empty when `other` is (no padding), else hold one value in
/// [0, max] per batch entry, since the kernels index them by entry and read rows below them.
inline void check_lengths(const char* field, const std::vector<std::int64_t>& lengths, const char* other_field,
                          const std::vector<std::int64_t>& other, std::int64_t batch, const char* max_field,
                          std::int64_t max) {
  if (lengths.empty() && other.empty()) return;
  const std::string size = "size " + std::to_string(lengths.size());
  if (lengths.empty()) {
    throw InvalidArgument(field, size,
                          std::string("must be set when ") + other_field + " is (one length per batch entry)");
  }
  if (static_cast<std::int64_t>(lengths.size()) != batch) {
    throw InvalidArgument(field, size, "must have one length per batch entry (batch = " + std::to_string(batch) + ")");
  }
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] < 0 || lengths[b] > max) {
      throw InvalidArgument(field, std::to_string(lengths[b]),
                            "entry " + std::to_string(b) + " must be in [0, " + max_field + " = " +
                                std::to_string(max) + "]");
    }
  }
}

/// A modifier's scalars and tensors must all be there, each tensor with its axes' element count.
inline void check_score_mod_values(const ReferenceProblem& p) {
  const ScoreMod& mod = p.score_mod;
  if (p.score_mod_scalars.size() != static_cast<std::size_t>(mod.scalars())) {
    throw InvalidArgument("score_mod_scalars", "size " + std::to_string(p.score_mod_scalars.size()),
                          "one value per scalar of the modifier (" + std::to_string(mod.scalars()) + ")");
  }
  if (p.score_mod_tensors.size() != static_cast<std::size_t>(mod.tensors())) {
    throw InvalidArgument("score_mod_tensors", "size " + std::to_string(p.score_mod_tensors.size()),
                          "one tensor per tensor of the modifier (" + std::to_string(mod.tensors()) + ")");
  }
  for (int i = 0; i < mod.tensors(); ++i) {
    const std::array<std::int64_t, 4> dims = tensor_dims(mod, i, {p.batch, p.heads_q, p.seq_q, p.seq_kv});
    const std::int64_t elements = dims[0] * dims[1] * dims[2] * dims[3];
    const std::size_t have = p.score_mod_tensors[static_cast<std::size_t>(i)].size();
    if (have != static_cast<std::size_t>(elements)) {
      throw InvalidArgument("score_mod_tensors[" + std::to_string(i) + "]", "size " + std::to_string(have),
                            std::to_string(elements) + " elements, as its axes span");
    }
  }
}

/// Sizes must be positive, the query heads must split evenly into groups over the kv heads, and
/// padding lengths, if any, must fit the padded sizes.
inline void check_reference_problem(const ReferenceProblem& p) {
  require_positive("batch", p.batch);
  require_positive("heads_q", p.heads_q);
  require_positive("heads_kv", p.heads_kv);
  require_positive("seq_q", p.seq_q);
  require_positive("seq_kv", p.seq_kv);
  require_positive("head_dim_qk", p.head_dim_qk);
  require_positive("head_dim_v", p.head_dim_v);
  if (p.heads_q % p.heads_kv != 0) {
    throw InvalidArgument("heads_q", std::to_string(p.heads_q),
                          "must be a multiple of heads_kv (" + std::to_string(p.heads_kv) + ")");
  }
  check_lengths("seq_len_q", p.seq_len_q, "seq_len_kv", p.seq_len_kv, p.batch, "seq_q", p.seq_q);
  check_lengths("seq_len_kv", p.seq_len_kv, "seq_len_q", p.seq_len_q, p.batch, "seq_kv", p.seq_kv);
  if (!(p.dropout >= 0.0 && p.dropout < 1.0)) {  // NaN fails too
    throw InvalidArgument("dropout", std::to_string(p.dropout), "must be a probability in [0, 1)");
  }
  check_score_mod_values(p);
}

/// The extra inputs the problem asks for must be there: the bias values when p.bias != none, the
/// per-head sink logits when p.softmax == sink, the keep mask when p.dropout > 0. (Outputs are
/// optional: null means not wanted.)
template <class T>
inline void check_reference_extras(const ReferenceProblem& p, const ReferenceExtras<T>& extras) {
  if (p.bias != Bias::none && extras.bias == nullptr) {
    throw InvalidArgument("extras.bias", "null", std::string("must be set when bias = ") + to_string(p.bias));
  }
  if (p.softmax == Softmax::sink && extras.sink == nullptr) {
    throw InvalidArgument("extras.sink", "null", "must be set when softmax = sink (one logit per query head)");
  }
  if (p.dropout > 0.0 && extras.dropout_mask == nullptr) {
    throw InvalidArgument("extras.dropout_mask", "null",
                          "must be set when dropout > 0 (the keep mask [b, h_q, s_q, s_kv], 0 or 1)");
  }
}

}  // namespace fusedattn::detail
