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

}  // namespace

DecodeSplit decode_split(const AttentionSpec& spec, Pass pass, int multiprocessors) noexcept {
  if (pass != Pass::forward || !spec.paged_kv() || spec.ragged_q() || !mergeable(spec)) return {};
  const std::int64_t queries = spec.seq_q();
  if (queries > kDecodeMaxQueries) return {};
  if (causal_bottom_right(spec) && queries > 1 && queries - 1 > spec.page_size()) return {};
  const std::int64_t pairs = spec.batch() * spec.heads_kv();
  const std::int64_t wanted = kDecodePairsPerSm * std::max(multiprocessors, 1);
  if (pairs >= wanted) return {};
  // As many chunks as make the pairs wanted, each of at least kDecodeMinChunkKeys keys (whole pages).
  const std::int64_t min_pages = ceil_div(kDecodeMinChunkKeys, spec.page_size());
  const std::int64_t most = std::max<std::int64_t>(spec.kv_pages / min_pages, 1);
  const std::int64_t chunks = std::min(ceil_div(wanted, pairs), most);
  if (chunks < 2) return {};
  const std::int64_t chunk_pages = ceil_div(spec.kv_pages, chunks);
  DecodeSplit out;
  out.chunk_pages = chunk_pages;
  out.chunks = ceil_div(spec.kv_pages, chunk_pages);
  return out.chunks < 2 ? DecodeSplit{} : out;
}

AttentionSpec decode_full_chunks_spec(const AttentionSpec& spec, const DecodeSplit& split) {
  AttentionSpec out = spec;
  const std::int64_t entries = spec.batch() * (split.chunks - 1);
  out.q = dense_entries(spec.q, entries);
  out.o = dense_entries(spec.o, entries);
  out.kv_pages = split.chunk_pages;
  out.window = Window{};  // every key of a full chunk is visible to every query
  out.alignment = Alignment::top_left;
  out.stats = true;
  return out;
}

AttentionSpec decode_final_chunk_spec(const AttentionSpec& spec, const DecodeSplit& split) {
  AttentionSpec out = spec;
  out.o = dense_entries(spec.o, spec.batch());
  out.kv_pages = split.chunk_pages + 1;
  out.stats = true;
  return out;
}

DecodeChunks decode_chunks(std::int64_t keys, std::int64_t queries, std::int64_t chunk_keys,
                           bool causal_queries) noexcept {
  if (keys <= 0) return {};
  DecodeChunks out;
  out.full = (keys - 1) / chunk_keys;  // the final chunk keeps 1 .. chunk_keys keys
  if (causal_queries && out.full > 0 && keys - out.full * chunk_keys < queries) --out.full;
  out.final_keys = keys - out.full * chunk_keys;
  return out;
}

}  // namespace fusedattn::detail
