// The split-decode rule and its inner specs (decode_split.h).
#include "support/decode_split.h"

#include <algorithm>

#include "fusedattn/layout.h"

namespace fusedattn::detail {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

bool causal_bottom_right(const AttentionSpec& spec) {
  return spec.window.causal() && spec.alignment == Alignment::bottom_right;
}

// What a chunk's call can take as the caller's call would, merged by log-sum-exp: nothing that
// changes a row's softmax beyond its keys (a sink or off-by-one adds to every chunk's denominator),
// nothing per score the chunks would have to shift (bias, ALiBi, a modifier, dropout's mask).
bool mergeable(const AttentionSpec& spec) {
  return spec.softmax == Softmax::vanilla && spec.bias == Bias::none && !spec.alibi && spec.dropout == 0.0 &&
         spec.score_mod.empty() && spec.max_logit == MaxLogit::none && !is_fp8(spec.q.dtype) &&
         (!spec.window.bounded() || causal_bottom_right(spec));
}

// q's (and o's) descriptor as a dense bshd tensor of `batch` entries.
TensorDesc dense_entries(TensorDesc desc, std::int64_t batch) {
  desc.dims[kBatch] = batch;
  const std::int64_t h = desc.dims[kHead], s = desc.dims[kSeq], d = desc.dims[kDim];
  desc.strides[kDim] = 1;
  desc.strides[kHead] = d;
  desc.strides[kSeq] = h * d;
  desc.strides[kBatch] = s * h * d;
  return desc;
}

// q's (and o's) descriptor with each K/V head's `group` query heads folded into its rows, dense bshd
// of `batch` entries: [batch, s * group, h / group, d], row t * group + i being query t of head
// k * group + i.
TensorDesc folded_entries(TensorDesc desc, std::int64_t batch, std::int64_t group) {
  desc.dims[kHead] /= group;
  desc.dims[kSeq] *= group;
  return dense_entries(desc, batch);
}

bool causal_queries(const AttentionSpec& spec) { return causal_bottom_right(spec) && spec.seq_q() > 1; }

// The pages of the masked call's table: from the page holding key len - s_q on, at most s_q - 1 +
// page_size keys; none without a bottom-right causal mask over several queries.
std::int64_t masked_pages(const AttentionSpec& spec) {
  return causal_queries(spec) ? ceil_div(spec.seq_q() - 1 + spec.page_size(), spec.page_size()) : 0;
}

// Whether the spec can be split at all: a cache no longer than the masked call's keys has nothing
// to split.
bool splittable(const AttentionSpec& spec, Pass pass) {
  return pass == Pass::forward && spec.paged_kv() && mergeable(spec) &&
         spec.seq_q() <= kDecodeMaxQueries && spec.kv_pages > masked_pages(spec);
}

}  // namespace

DecodeSplit decode_split(const AttentionSpec& spec, Pass pass, int multiprocessors) noexcept {
  if (!splittable(spec, pass)) return {};
  // As many chunks as one round of tiles holds (two rounds with one query), each of at least
  // kDecodeMinChunkKeys keys in whole pages. The chunks' call then fills its rounds (more than
  // half of the last: its b * chunks entries split again into fewer than two chunks a round), or
  // its chunks are shorter than two of that minimum.
  const std::int64_t round = decode_tiles_per_sm(spec) * std::max(multiprocessors, 1);
  const std::int64_t min_pages = ceil_div(kDecodeMinChunkKeys, spec.page_size());
  const std::int64_t in_a_round = round / (spec.batch() * decode_tiles_per_entry(spec));
  if (in_a_round < 2) return {};
  const std::int64_t rounds = spec.seq_q() == 1 ? kDecodeOneQueryRounds : 1;
  return decode_split_in_chunks(spec, pass, std::min(in_a_round * rounds, spec.kv_pages / min_pages));
}

DecodeSplit decode_split_in_chunks(const AttentionSpec& spec, Pass pass, std::int64_t chunks) noexcept {
  chunks = std::min(chunks, spec.kv_pages);
  if (chunks < 2 || !splittable(spec, pass)) return {};
  DecodeSplit out;
  out.final_pages = masked_pages(spec);
  // Whole pages a chunk; still at least two chunks (2 <= chunks <= kv_pages, so chunk_pages < kv_pages).
  out.chunk_pages = ceil_div(spec.kv_pages, chunks);
  out.chunks = ceil_div(spec.kv_pages, out.chunk_pages);
  return out;
}

std::int64_t decode_tiles_per_entry(const AttentionSpec& spec) noexcept {
  if (spec.seq_q() == 1) return spec.heads_q();  // unfolded: one tile a query head
  const std::int64_t group = decode_query_group(spec);
  return spec.heads_q() / group * ceil_div(spec.seq_q() * group, kDecodeFoldedTileRows);
}

std::int64_t decode_tiles_per_sm(const AttentionSpec& spec) noexcept {
  return spec.seq_q() == 1 ? kDecodeOneQueryTilesPerSm : kDecodeFoldedTilesPerSm;
}

AttentionSpec decode_chunks_spec(const AttentionSpec& spec, const DecodeSplit& split) {
  AttentionSpec out = spec;
  const std::int64_t entries = spec.batch() * split.chunks, group = decode_query_group(spec);
  out.q = folded_entries(spec.q, entries, group);
  out.o = folded_entries(spec.o, entries, group);
  out.kv_pages = split.chunk_pages;
  out.window = Window{};  // every key of a chunk is visible to every query
  out.alignment = Alignment::top_left;
  out.stats = true;
  return out;
}

std::int64_t decode_query_group(const AttentionSpec& spec) noexcept {
  return spec.seq_q() > 1 ? spec.heads_q() / spec.heads_kv() : 1;
}

AttentionSpec decode_masked_spec(const AttentionSpec& spec, const DecodeSplit& split) {
  AttentionSpec out = spec;
  if (spec.ragged_q()) out.q = dense_entries(spec.q, spec.batch());  // a dense copy of the queries
  out.o = dense_entries(spec.o, spec.batch());
  out.kv_pages = split.final_pages;
  out.stats = true;
  return out;
}

DecodeCut decode_cut(std::int64_t keys, std::int64_t queries, std::int64_t page_size, bool causal_queries) noexcept {
  if (keys <= 0) return {};
  DecodeCut out;
  out.unmasked = causal_queries ? std::max<std::int64_t>(keys - queries, 0) / page_size * page_size : keys;
  out.masked = keys - out.unmasked;
  return out;
}

std::int64_t decode_chunk_keys(const DecodeCut& cut, std::int64_t chunk, std::int64_t chunk_keys) noexcept {
  return std::clamp<std::int64_t>(cut.unmasked - chunk * chunk_keys, 0, chunk_keys);
}

}  // namespace fusedattn::detail
