// Internal: decode over a paged cache with each sequence's keys cut into chunks, so that a small
// batch fills the GPU. cuDNN's paged kernel gives each (sequence, K/V head) pair to one part of the
// GPU: measured on an H200 (h 32/8, d 128, 64-token pages), b = 1 reads the cache at 0.03-0.05 of
// the copy bandwidth, b = 8 at 0.27-0.31 and b = 64 at 0.86. Split, the chunks of all sequences are
// the entries of cuDNN calls on slices of the page table (the cache is never copied), each giving
// its partial O and log-sum-exp, and one small kernel merges them (exec/decode_split.h).
//
// The chunks of a sequence: `full` chunks of chunk_pages pages each, every key visible to every
// query, and a final chunk with the rest of the keys (1 .. chunk_pages * page_size of them), which
// holds the call's mask: with a bottom-right causal mask and several queries the final chunk must
// hold every key some query cannot see, so it takes at least as many keys as there are queries, one
// full chunk fewer where the rest is shorter (then up to one page more than a chunk, which a page of
// at least s_q - 1 tokens makes room for). So two calls: every sequence's full chunks without a mask,
// and every sequence's final chunk with the caller's mask and lengths.
#pragma once

#include <cstdint>

#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn::detail {

/// The (sequence, K/V head) pairs a call must offer to keep an SM 9.0 GPU's multiprocessors busy:
/// two per SM (b = 64 at h_kv = 8, 512 pairs on 132 SMs, reached 0.86 of the bandwidth unsplit).
constexpr std::int64_t kDecodePairsPerSm = 2;
/// The fewest keys a chunk may have: below this a chunk's fixed cost (its row of partials, the
/// merge's read of it) outweighs the keys it streams.
constexpr std::int64_t kDecodeMinChunkKeys = 256;
/// The most queries a split decode takes (speculative decoding's 2 .. 16 and a little more).
constexpr std::int64_t kDecodeMaxQueries = 16;

struct DecodeSplit {
  std::int64_t chunks = 1;       ///< chunks a sequence's keys may take, the final one included; 1: no split
  std::int64_t chunk_pages = 0;  ///< pages of a full chunk (the final chunk's table has one more)
  bool split() const noexcept { return chunks > 1; }
};

/// The pure rule: a forward over a paged cache with dense queries (at most kDecodeMaxQueries of
/// them), vanilla softmax, no bias, ALiBi, dropout, score modifier, max logit or FP8, and no mask
/// or a bottom-right causal one (for which, with several queries, a page must hold s_q - 1 tokens),
/// splits when b * h_kv pairs are fewer than kDecodePairsPerSm per SM: into as many chunks as
/// make that many, each of at least kDecodeMinChunkKeys keys; no split where that is one chunk.
DecodeSplit decode_split(const AttentionSpec& spec, Pass pass, int multiprocessors) noexcept;

/// The inner calls' specs: the full chunks of every sequence as b * (chunks - 1) entries of
/// chunk_pages pages, queries and partial O dense [entries, s_q, h_q, d] (bshd), no mask; and the
/// final chunks as b entries of chunk_pages + 1 pages, the caller's queries and mask, partial O
/// dense. Both write their statistics.
AttentionSpec decode_full_chunks_spec(const AttentionSpec& spec, const DecodeSplit& split);
AttentionSpec decode_final_chunk_spec(const AttentionSpec& spec, const DecodeSplit& split);

/// How one sequence of `keys` keys and `queries` queries is cut: `full` chunks of chunk_keys keys,
/// then `final_keys` keys in the final chunk (0 for an empty sequence). `causal_queries`: the
/// bottom-right causal mask with several queries, for which the final chunk holds at least
/// `queries` keys where the sequence has them. The exec layer runs the same arithmetic on the
/// device; this is its reference.
struct DecodeChunks {
  std::int64_t full = 0;
  std::int64_t final_keys = 0;
};
DecodeChunks decode_chunks(std::int64_t keys, std::int64_t queries, std::int64_t chunk_keys,
                           bool causal_queries) noexcept;

}  // namespace fusedattn::detail
