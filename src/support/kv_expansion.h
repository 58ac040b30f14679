// Internal: when a backward runs grouped K/V heads as one K/V head per query head.
//
// cuDNN's FP8 backward on SM 9.0 (cuDNN 9.19) gives each CTA one 128-key tile of one K/V head and
// loops over the query heads of its group; with grouped heads and few tiles the GPU idles through
// the causal tail. Measured on an H200 (b=1, s=8k, d=128, causal): h 64/8 takes 7.53 ms, the same
// work with 64 K/V heads 5.13 ms; at s=32k (h 32/8, four times the tiles) grouping costs nothing.
// Such a backward copies K and V to one head per query head, runs the ungrouped graph and sums each
// group's dK and dV (exec/kv_expansion.h). The 16-bit backward is left grouped: there, 64/8 and
// 64/64 take the same time (5.48 and 5.47 ms).
#pragma once

#include <cstddef>

#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn::detail {

/// The key tile of cuDNN's FP8 backward, and how many full waves of those tiles keep an SM 9.0
/// GPU busy through a causal tail (the measured shapes: 3.9 waves idle, 15.5 do not).
constexpr std::int64_t kExpansionKeyTile = 128;
constexpr std::int64_t kExpansionMinWaves = 8;

/// True for a dense per-tensor FP8 backward without padding (MXFP8 stays grouped: its FP8 copies
/// and block scales of K and V would need expanding too), with grouped heads (h_q > h_kv) whose
/// b * h_kv * ceil(s_kv / 128) key tiles make fewer than kExpansionMinWaves waves over
/// `multiprocessors` SMs, and whose K and V have rows in 16-byte units (in_16_byte_rows), which the
/// copies move at once.
bool expands_kv_heads(const AttentionSpec& spec, Pass pass, int multiprocessors) noexcept;

/// The head dim and every stride but d's a multiple of 16 bytes.
bool in_16_byte_rows(const TensorDesc& desc) noexcept;

/// The spec the expanded backward's graph is built for: K and V (and so dK, dV) with h_q heads,
/// contiguous [b, s_kv, h_q, d]; everything else as in `spec`.
AttentionSpec kv_expanded_spec(const AttentionSpec& spec);

/// Where the expanded tensors lie in a workspace: K, V, dK, dV of kv_expanded_spec, each at a
/// 256-byte boundary, then two float32 amaxes (the ungrouped dK's and dV's, which are not the
/// grouped tensors' amaxes and are dropped).
struct KvExpansionLayout {
  std::size_t k = 0, v = 0, d_k = 0, d_v = 0, amax_d_k = 0, amax_d_v = 0;  ///< byte offsets
  std::size_t bytes = 0;                                                    ///< the whole span
};
KvExpansionLayout kv_expansion_layout(const AttentionSpec& spec);

}  // namespace fusedattn::detail
