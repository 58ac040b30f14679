// Bucketing of ragged specs (fusedattn/ragged.h).
#include "fusedattn/ragged.h"

#include <algorithm>

namespace fusedattn {
namespace {

std::int64_t next_power_of_two(std::int64_t n) noexcept {
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

constexpr std::int64_t kSmallestSequenceBucket = 64;

}  // namespace

std::int64_t batch_bucket(std::int64_t batch) noexcept { return next_power_of_two(std::max<std::int64_t>(batch, 1)); }

std::int64_t sequence_bucket(std::int64_t seq) noexcept {
  return next_power_of_two(std::max(seq, kSmallestSequenceBucket));
}

AttentionSpec bucketed(const AttentionSpec& spec) {
  if (!spec.ragged_q() && !spec.ragged_kv()) return spec;
  AttentionSpec out = spec;
  // The batch is bucketed only when every tensor is ragged: a dense K/V or a page table has
  // exactly the call's entries in memory, and a plan with more would address past them.
  const bool all_ragged = spec.ragged_q() && spec.ragged_kv();
  for (TensorDesc* desc : {&out.q, &out.k, &out.v, &out.o}) {
    if (all_ragged) desc->dims[kBatch] = batch_bucket(spec.batch());
    if (desc->ragged()) desc->dims[kSeq] = sequence_bucket(desc->dims[kSeq]);
  }
  return out;
}

}  // namespace fusedattn
