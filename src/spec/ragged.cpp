// Bucketing of ragged specs (fusedattn/ragged.h).
#include "fusedattn/ragged.h"

#include <algorithm>
#include <vector>

namespace fusedattn {
namespace {

std::int64_t next_power_of_two(std::int64_t n) noexcept {
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

constexpr std::int64_t kSmallestSequenceBucket = 64;

// Ragged queries over a paged cache are decode steps and speculative ones (1 to 16 queries a
// sequence) as often as prefills: their buckets start at 1, so that a step's plan has its own few
// queries, which the split decode needs (support/decode_split.h: at most 16), and not 64 of them.
std::int64_t smallest_bucket(const AttentionSpec& spec, bool queries) {
  return spec.paged_kv() && queries ? 1 : kSmallestSequenceBucket;
}

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
    const std::int64_t smallest = smallest_bucket(spec, desc == &out.q || desc == &out.o);
    if (desc->ragged()) desc->dims[kSeq] = next_power_of_two(std::max(desc->dims[kSeq], smallest));
  }
  return out;
}

namespace {

// The buckets up to (and including) the one `largest` falls in.
std::vector<std::int64_t> buckets_up_to(std::int64_t largest, std::int64_t smallest) {
  std::vector<std::int64_t> buckets;
  for (std::int64_t b = smallest; b < largest; b *= 2) buckets.push_back(b);
  buckets.push_back(largest);
  return buckets;
}

}  // namespace

std::vector<AttentionSpec> ragged_buckets(const AttentionSpec& spec) {
  if (!spec.ragged_q() && !spec.ragged_kv()) return {spec};
  const AttentionSpec top = bucketed(spec);
  const bool all_ragged = spec.ragged_q() && spec.ragged_kv();
  const auto batches = all_ragged ? buckets_up_to(top.batch(), 1) : std::vector<std::int64_t>{top.batch()};
  const auto seqs_q = spec.ragged_q() ? buckets_up_to(top.q.seq(), smallest_bucket(top, true))
                                      : std::vector<std::int64_t>{top.q.seq()};
  const auto seqs_kv = spec.ragged_kv() ? buckets_up_to(top.k.seq(), kSmallestSequenceBucket)
                                        : std::vector<std::int64_t>{top.k.seq()};
  const bool paired = all_ragged && top.q.seq() == top.k.seq();  // self-attention: one length per sequence
  std::vector<AttentionSpec> specs;
  for (std::int64_t batch : batches) {
    for (std::int64_t seq_q : seqs_q) {
      for (std::int64_t seq_kv : seqs_kv) {
        if (paired && seq_kv != seq_q) continue;
        AttentionSpec out = top;
        for (TensorDesc* desc : {&out.q, &out.k, &out.v, &out.o}) {
          if (all_ragged) desc->dims[kBatch] = batch;
          if (desc->ragged()) desc->dims[kSeq] = desc == &out.q || desc == &out.o ? seq_q : seq_kv;
        }
        specs.push_back(out);
      }
    }
  }
  return specs;
}

}  // namespace fusedattn
