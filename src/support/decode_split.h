// Internal: decode over a paged cache with each sequence's keys cut into chunks, so that a small
// batch fills the GPU. cuDNN's paged kernel gives each (sequence, K/V head) pair to one part of the
// GPU: measured on an H200 (h 32/8, d 128, 64-token pages), b = 1 reads the cache at 0.03-0.05 of
// the copy bandwidth, b = 8 at 0.27-0.31 and b = 64 at 0.86. Split, the chunks of all sequences are
// the entries of a cuDNN call over page tables cut from the caller's (the cache is never copied),
// each giving its partial O and log-sum-exp, and one small kernel merges them (exec/decode_split.h).
//
// The keys of a sequence: those every query sees, cut into chunks of chunk_pages pages (the last
// one partial), all sequences' chunks the entries of one call without a mask; and, for a
// bottom-right causal mask with several queries, the keys some query cannot see, from the page
// holding key len - s_q on (at most s_q - 1 + page_size keys), in a second call of b entries with
// the caller's mask. Every partial is merged by its log-sum-exp.
#pragma once

#include <cstdint>

#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn::detail {

/// cuDNN 9.19's paged decode kernels run a call as tiles of query rows, one (entry, head) each, so
/// many at once per SM; the rest wait for a second round. Measured on the H200 (h 32/8, d 128,
/// 64-token pages; `bench/profile_decode_kernels.py`, cuDNN's call alone over b sequences cut into
/// c chunks, 2026-12-02): one query runs tiles of 16 rows, 4 an SM (b = 8 at 32k: 2 chunks, 512
/// tiles in one round, 250 µs for the whole call, at the copy bandwidth; the earlier rule's 6
/// chunks, 1,536 tiles in three rounds, 303 µs for cuDNN's kernel alone); several queries, folded,
/// run tiles of 64 rows, 1 an SM (b = 8 with 16 queries at 8k: 128 tiles 82 µs, 256 84 µs, 512
/// 86 µs).
constexpr std::int64_t kDecodeOneQueryTilesPerSm = 4;
constexpr std::int64_t kDecodeFoldedTileRows = 64;
constexpr std::int64_t kDecodeFoldedTilesPerSm = 1;
/// The rounds of tiles a split fills: two with one query, one with several. One query was no slower
/// in two rounds at any point measured, and faster at some (`bench/profile_decode_kernels.py`'s
/// sweep of chunk counts, the GPU script's decodeprof part: b = 1 at 8k 20.3 µs in 32
/// chunks against 21.7 in 16, at 128k 138.5 against 141.4; b = 8 at 32k 258.7 in 4 against 262.8
/// in 2); several queries were slower (b = 4 with 8 at 8k: 58.2 µs in 8 chunks against 52.1 in 4;
/// b = 1 with 16 at 32k: 63.3 in 32 against 57.2 in 16). Whether to split at all stays one round's
/// question: where one round holds fewer than two chunks of every sequence the call is not split.
constexpr std::int64_t kDecodeOneQueryRounds = 2;
/// The fewest keys a chunk may have: below this a chunk's fixed cost (its row of partials, the
/// merge's read of it) outweighs the keys it streams.
constexpr std::int64_t kDecodeMinChunkKeys = 256;
/// The most queries a split decode takes (speculative decoding's 2 .. 16).
constexpr std::int64_t kDecodeMaxQueries = 16;

struct DecodeSplit {
  std::int64_t chunks = 1;       ///< chunks of a sequence's keys in the unmasked call; 1: no split
  std::int64_t chunk_pages = 0;  ///< pages of a chunk
  std::int64_t final_pages = 0;  ///< pages of the masked call's table; 0: no masked call
  bool split() const noexcept { return chunks > 1; }
};

/// The pure rule: a forward over a paged cache with dense or ragged queries (at most
/// kDecodeMaxQueries of them: a ragged plan's longest), vanilla softmax, no bias, ALiBi, dropout,
/// score modifier, max logit or FP8, and no mask or a bottom-right causal one, splits each
/// sequence's keys into as many chunks as fill kDecodeOneQueryRounds rounds of the chunks' call's
/// tiles (one query) or one round (several) on `multiprocessors` SMs (decode_tiles_per_entry),
/// each of at least kDecodeMinChunkKeys keys; no split where one round holds fewer than two chunks
/// of every sequence (the call fills the GPU already; more rounds would cost what the split
/// saves), where the cache holds fewer than two chunks, or where it is no longer than the masked
/// call's keys. The inner calls then never split.
DecodeSplit decode_split(const AttentionSpec& spec, Pass pass, int multiprocessors) noexcept;
/// The split into about `chunks` chunks of ceil(kv_pages / chunks) whole pages (10 pages asked in
/// 4 chunks: 4 of 3 pages, the last partial; asked in 6: 5 of 2) wherever decode_split could split
/// at all; no split for fewer than two. decode_split's own count goes through it; the diagnostic
/// (FUSEDATTN_SPLIT_DECODE=n, exec/decode_split.h) forces others where decode_split splits.
DecodeSplit decode_split_in_chunks(const AttentionSpec& spec, Pass pass, std::int64_t chunks) noexcept;

/// Whether the split has a masked call (a bottom-right causal mask with several queries).
inline bool has_masked_call(const DecodeSplit& split) noexcept { return split.final_pages > 0; }

/// The inner calls' specs: the chunks of every sequence as b * chunks entries of chunk_pages pages,
/// no mask, with several queries' grouped heads folded into rows: the g query heads that share a
/// K/V head are g * s_q rows of one head, queries and partial O dense [entries, s_q * g, h_kv, d]
/// (bshd; row t * g + i is query t of head k * g + i; g = 1: [entries, s_q, h_q, d]). Without a
/// mask that is the same attention, and cuDNN's kernels then read a chunk's keys once per K/V head
/// instead of once per query head. And the masked keys as b entries of final_pages pages, the
/// caller's queries (ragged ones copied dense, [b, s_q, h_q, d]) and mask, partial O dense
/// [b, s_q, h_q, d_v]. Both write their statistics.
AttentionSpec decode_chunks_spec(const AttentionSpec& spec, const DecodeSplit& split);
AttentionSpec decode_masked_spec(const AttentionSpec& spec, const DecodeSplit& split);
/// The tiles of cuDNN's decode kernel one entry of the chunks' call takes: one query, a tile per
/// query head; several queries, folded, kDecodeFoldedTileRows rows a tile per K/V head. And how
/// many of them an SM runs at once.
std::int64_t decode_tiles_per_entry(const AttentionSpec& spec) noexcept;
std::int64_t decode_tiles_per_sm(const AttentionSpec& spec) noexcept;
/// The query heads folded into one head's rows in the chunks' call: h_q / h_kv with several
/// queries, 1 with one. Measured on the H200 (h 32/8, d 128, 64-token pages): folded, b = 1 with 16
/// queries over 32k keys took 130.6 µs against 225.5 unfolded, but a single query got slower
/// (b = 1: 48.2 against 40.8 µs at 8k, 97.1 against 86.0 at 32k; b = 8 at 8k: 112.8 against
/// 109.6): cuDNN ran its call on 4 rows of 8 heads slower than on 1 row of 32.
std::int64_t decode_query_group(const AttentionSpec& spec) noexcept;

/// How one sequence of `keys` keys and `queries` queries is cut: the first `unmasked` keys go to
/// the chunks (chunk c takes clamp(unmasked - c * chunk_keys, 0, chunk_keys) of them), the other
/// `masked` keys to the masked call: with `causal_queries` (a bottom-right causal mask and several
/// queries) from the page holding key keys - queries on, else none. The exec layer runs the same
/// arithmetic on the device; this is its reference.
struct DecodeCut {
  std::int64_t unmasked = 0;
  std::int64_t masked = 0;
};
DecodeCut decode_cut(std::int64_t keys, std::int64_t queries, std::int64_t page_size, bool causal_queries) noexcept;
std::int64_t decode_chunk_keys(const DecodeCut& cut, std::int64_t chunk, std::int64_t chunk_keys) noexcept;

}  // namespace fusedattn::detail
