// Internal: causal attention with a score modifier as several cuDNN calls that leave out the
// masked blocks. cuDNN 9.19 switches its causal mask off beside a modifier, so the mask written
// into the modifier (score_mod_lowering) still has one call compute the whole square: twice the
// work of a causal call. Cut into blocks, the calls together compute about (n + 1) / 2n of it.
//
// Forward: query block i (rows i*B ..) against the keys it sees, 0 .. i*B + rows + shift, each
// block complete (O and its statistics). Backward: key block j (keys j*B ..) against the queries
// that see it, from max(0, j*B - shift) to the end, each block's dK and dV complete and its dQ a
// part, summed in float32. shift = s_kv - s_q (bottom-right; 0 for top-left with s_q = s_kv).
// Each block is a spec of its own (its own cached plan), whose modifier reads the indices of the
// whole problem (shift_indices).
#pragma once

#include <cstdint>

#include "fusedattn/spec.h"

namespace fusedattn::detail {

struct CausalBlocks {
  std::int64_t size = 0;   ///< rows of a forward block, keys of a backward block
  std::int64_t count = 0;  ///< blocks of the forward (ceil(s_q / size)); 0: one call
  bool split() const noexcept { return count > 1; }
};

/// The pure rule. Blocks of 1024 rows or more, at most 8 of them (each call must fill the GPU,
/// and the work saved, 1 - (n + 1) / 2n, grows slowly past 8: 44% at 8, 47% at 16), for causal
/// f16/bf16 calls with a modifier and nothing a block could not take as a view: no padding, bias,
/// dropout, sink, max logit or packed layout, and tensors of the modifier over the batch and heads,
/// or the queries alone, or the keys alone. No split below two blocks.
CausalBlocks causal_blocks(const AttentionSpec& spec);

/// The spec of forward block `i` / backward block `j` of `spec` (split by `blocks`).
AttentionSpec forward_block(const AttentionSpec& spec, const CausalBlocks& blocks, std::int64_t i);
AttentionSpec backward_block(const AttentionSpec& spec, const CausalBlocks& blocks, std::int64_t j);

/// Where forward block i's queries start, and backward block j's queries and keys start.
std::int64_t forward_first_row(const CausalBlocks& blocks, std::int64_t i);
std::int64_t backward_first_row(const AttentionSpec& spec, const CausalBlocks& blocks, std::int64_t j);
std::int64_t backward_first_key(const CausalBlocks& blocks, std::int64_t j);
/// Backward blocks: ceil(s_kv / size).
std::int64_t backward_count(const AttentionSpec& spec, const CausalBlocks& blocks);

}  // namespace fusedattn::detail
