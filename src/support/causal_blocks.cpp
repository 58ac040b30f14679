// The causal blocking rule and the blocks' specs (support/causal_blocks.h).
#include "support/causal_blocks.h"

#include <algorithm>

namespace fusedattn::detail {
namespace {

constexpr std::int64_t kMinBlock = 1024;
constexpr std::int64_t kMaxBlocks = 8;
constexpr std::int64_t kTile = 128;  // cuDNN's row and key tiles

std::int64_t shift_of(const AttentionSpec& spec) {
  return spec.alignment == Alignment::bottom_right ? spec.seq_kv() - spec.seq_q() : 0;
}

// Tensors a block can take as a view of the caller's: none of the query or key axes, or one alone.
// A backward block's queries start at a key block's start minus the shift, so a tensor along the
// queries keeps its 16-byte alignment there only when the shift is a multiple of 4 floats.
bool tensors_slice(const AttentionSpec& spec) {
  const ScoreMod& mod = spec.score_mod;
  for (int i = 0; i < mod.tensors(); ++i) {
    const std::uint8_t axes = mod.tensor_axes(i);
    const bool spans_q = axes & kAxisQ, spans_kv = axes & kAxisKv;
    if ((spans_q || spans_kv) && axes != kAxisQ && axes != kAxisKv) return false;
    if (axes == kAxisQ && shift_of(spec) % 4 != 0) return false;
  }
  return true;
}

AttentionSpec block_of(const AttentionSpec& spec, std::int64_t rows, std::int64_t keys, std::int64_t first_row,
                       std::int64_t first_key, Window window, Alignment alignment) {
  AttentionSpec block = spec;
  block.q.dims[kSeq] = rows;
  block.o.dims[kSeq] = rows;
  block.k.dims[kSeq] = keys;
  block.v.dims[kSeq] = keys;
  block.window = window;
  block.alignment = alignment;
  block.score_mod = shift_indices(spec.score_mod, first_row, first_key);
  return block;
}

}  // namespace

CausalBlocks causal_blocks(const AttentionSpec& spec) {
  const bool dense = !spec.padding && !spec.ragged_q() && !spec.ragged_kv() && !spec.paged_kv();
  const bool plain_terms = spec.bias == Bias::none && !spec.alibi && spec.dropout == 0.0 &&
                           spec.softmax == Softmax::vanilla && spec.max_logit == MaxLogit::none;
  const bool aligned = spec.alignment == Alignment::bottom_right ? spec.seq_kv() >= spec.seq_q()
                                                                 : spec.seq_kv() == spec.seq_q();
  if (spec.score_mod.empty() || !spec.window.causal() || !dense || !plain_terms || !aligned || is_fp8(spec.q.dtype) ||
      !tensors_slice(spec)) {
    return {};
  }
  // 8 blocks of at least 1024 rows, in whole tiles: s_q = 8192 -> 8 x 1024; 32768 -> 8 x 4096;
  // 2048 -> 2 x 1024; 1024 -> one call.
  const std::int64_t per_block = (spec.seq_q() + kMaxBlocks - 1) / kMaxBlocks;
  const std::int64_t size = std::max(kMinBlock, (per_block + kTile - 1) / kTile * kTile);
  const std::int64_t count = (spec.seq_q() + size - 1) / size;
  if (count < 2) return {};
  return CausalBlocks{size, count};
}

std::int64_t forward_first_row(const CausalBlocks& blocks, std::int64_t i) { return i * blocks.size; }

AttentionSpec forward_block(const AttentionSpec& spec, const CausalBlocks& blocks, std::int64_t i) {
  const std::int64_t first = forward_first_row(blocks, i);
  const std::int64_t rows = std::min(blocks.size, spec.seq_q() - first);
  // Its last row sees up to key first + rows - 1 + shift: bottom-right within the block.
  const std::int64_t keys = first + rows + shift_of(spec);
  return block_of(spec, rows, keys, first, 0, kCausal, Alignment::bottom_right);
}

std::int64_t backward_first_key(const CausalBlocks& blocks, std::int64_t j) { return j * blocks.size; }

std::int64_t backward_first_row(const AttentionSpec& spec, const CausalBlocks& blocks, std::int64_t j) {
  return std::max<std::int64_t>(0, backward_first_key(blocks, j) - shift_of(spec));
}

std::int64_t backward_count(const AttentionSpec& spec, const CausalBlocks& blocks) {
  return (spec.seq_kv() + blocks.size - 1) / blocks.size;
}

AttentionSpec backward_block(const AttentionSpec& spec, const CausalBlocks& blocks, std::int64_t j) {
  const std::int64_t first_key = backward_first_key(blocks, j);
  const std::int64_t first_row = backward_first_row(spec, blocks, j);
  const std::int64_t keys = std::min(blocks.size, spec.seq_kv() - first_key);
  // Query r (global first_row + r) sees key c (global first_key + c) when c <= r + right, with
  // right = first_row + shift - first_key: 0 once the block's keys start past the shift.
  const std::int64_t right = first_row + shift_of(spec) - first_key;
  return block_of(spec, spec.seq_q() - first_row, keys, first_row, first_key, Window{-1, right}, Alignment::top_left);
}

}  // namespace fusedattn::detail
