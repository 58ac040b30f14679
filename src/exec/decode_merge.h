// Internal: the library's one CUDA merge of partial attention results by their log-sum-exp: a
// decode's keys cut into chunks (fusedattn's decode kernel, exec/decode_kernel.h, and cuDNN's split
// decode, exec/decode_split.h), each chunk's partial O and statistic merged per query row into the
// caller's O (and statistics). One small kernel, on the caller's stream, capture-safe.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fusedattn/spec.h"

namespace fusedattn::detail {

/// A ragged call's sequences (attention.h's RaggedTensors), cu_q null for dense queries: sequence i
/// has cu_q[i + 1] - cu_q[i] queries and cu_kv[i + 1] - cu_kv[i] keys, its first query row (of q, O
/// and the statistics) is token start[i], and its room runs to start[i + 1] (a gap past its queries
/// only with padded starts). Entries from `sequences` on are empty.
struct RaggedRows {
  const std::int32_t* cu_q = nullptr;
  const std::int32_t* cu_kv = nullptr;
  const std::int32_t* start = nullptr;
  int sequences = 0;
};

/// The chunks' partials, folded: the g query heads that share a K/V head are the rows of that head.
struct DecodePartials {
  /// [b * chunks, s_q * g, h_kv, d_v] dense, entry i * chunks + c sequence i's chunk c, row t * g + j
  /// query t of head k * g + j: float32, or O's dtype.
  const void* o = nullptr;
  bool float32 = false;
  const float* stats = nullptr;         ///< [b * chunks, h_kv, s_q * g], natural log-sum-exp
  const std::int32_t* keys = nullptr;   ///< [b * chunks]: each chunk's keys; null: its statistic says (-inf: none)
  std::int64_t chunks = 1;
  std::int64_t group = 1;               ///< g, the query heads a K/V head's rows fold
  /// A second call's partials over other keys of every sequence (the split decode's masked call):
  /// O [b, s_q, h_q, d_v] dense in the partials' dtype, statistics [b, h_q, s_q], keys [b]; null: none.
  const void* o_masked = nullptr;
  const float* stats_masked = nullptr;
  const std::int32_t* keys_masked = nullptr;
  /// The softmax's extra logit, added once to every row's denominator (a chunk's call leaves it out):
  /// softmax=sink's [h_q] logits, or off-by-one's 0; neither: vanilla.
  const float* sink = nullptr;
  bool off_by_one = false;
};

/// Merges `partials` into `o` (spec.o's layout; ragged by token) and, where `stats` is not null,
/// the statistics (dense [b, h_q, s_q]; ragged [T, h_q]). Rows past a sequence's queries (len_q,
/// null for s_q each, or the ragged rows) are zero (dense ones with a log-sum-exp of -inf), and a
/// row whose chunks saw no key is O 0 and log-sum-exp -inf, as the references give. Throws CudaError if the launch fails.
void merge_decode_partials(const AttentionSpec& spec, const DecodePartials& partials, const std::int32_t* len_q,
                           const RaggedRows& ragged, void* o, float* stats, bool early, cudaStream_t stream);

/// Whether the decode kernels may be launched early (programmatic dependent launch) on the current
/// device: only where the code that runs is SM 9.0's, which waits; on older GPUs, or from PTX built
/// for them, they serialize as usual. FUSEDATTN_DECODE_EARLY_LAUNCH=0 (read once) serializes always,
/// for the diagnostic's comparison.
bool decode_early_launch();

}  // namespace fusedattn::detail
