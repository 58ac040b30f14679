// Input checks shared by the CPU and GPU references: a bad problem must throw, not read out of bounds.
#pragma once

#include <cstdint>
#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/reference.h"

namespace fusedattn::detail {

inline void require_positive(const char* field, std::int64_t value) {
  if (value < 1) throw InvalidArgument(field, std::to_string(value), "must be at least 1");
}

/// Sizes must be positive and the query heads must split evenly into groups over the kv heads.
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
}

}  // namespace fusedattn::detail
