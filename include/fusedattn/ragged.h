// fusedattn/ragged.h — how variable-length (ragged) batches map onto cached plans.
//
// A ragged call names its batch size and its longest sequences on the host (as varlen APIs do);
// the sequences themselves are runtime data (cumulative offsets, attention.h). The plan's batch
// and sequence dims are bucketed so that a training loop over random packed batches compiles a
// handful of plans, not one per step:
//
//   batch bucket    = the next power of two           (1, 2, 4, ..., 64, 128, ...)
//   sequence bucket = the next power of two, >= 64    (64, 128, ..., 4096, 8192, ...)
//
// Worked numbers: batches of 1..64 sequences reach 7 batch buckets (1, 2, 4, 8, 16, 32, 64), and
// longest sequences of 1..4096 tokens reach 7 sequence buckets (64 .. 4096), so such a loop builds
// at most 7 x 7 x 7 = 343 plans per pass with independent Q and KV lengths, and 7 x 7 = 49 when Q
// and K/V share their lengths (self-attention, packed QKV). Total tokens never enter a plan: they
// only move the offsets. A bucketed plan runs a call with fewer sequences by giving the extra
// entries length 0, and a shorter longest sequence needs nothing at all.
//
// Ragged Q with dense or paged K/V: only the ragged sequence dims are bucketed. The batch is not,
// since dense K/V (and page tables) hold exactly the call's entries: one plan per batch size. Over
// a paged cache the query buckets start at 1 (1, 2, 4, ..., 64, ...): decode steps and speculative
// ones have a few queries a sequence, and a plan for 64 would not split its keys (a split decode
// takes at most 16 queries).
#pragma once

#include <cstdint>
#include <vector>

#include "fusedattn/spec.h"

namespace fusedattn {

/// The plan batch for a call of `batch` sequences (>= 1).
std::int64_t batch_bucket(std::int64_t batch) noexcept;
/// The plan sequence dim for a call whose longest sequence has `seq` tokens (>= 1); for queries
/// over a paged cache the buckets start at 1 instead (above).
std::int64_t sequence_bucket(std::int64_t seq) noexcept;

/// `spec` with the sequence dims of its ragged tensors rounded up to their buckets, and its batch
/// too when every tensor is ragged; a spec with no ragged tensor is returned as it is.
AttentionSpec bucketed(const AttentionSpec& spec);

/// Every plan a ragged training loop up to `spec`'s batch and longest sequences can meet
/// (above): each batch bucket up to the spec's, times each sequence bucket up to its
/// (Q and K/V buckets together when the spec's are equal, as in self-attention; every pair
/// otherwise). Only what bucketed() moves is varied: the batch when every tensor is ragged, the
/// ragged sequence dims. A spec without ragged tensors comes back alone.
std::vector<AttentionSpec> ragged_buckets(const AttentionSpec& spec);

}  // namespace fusedattn
