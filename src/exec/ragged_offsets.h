// Internal: turning a ragged call's cumulative offsets into what cuDNN reads, in one launch.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fusedattn/attention.h"

namespace fusedattn::detail {

/// Elements from one token to the next in each ragged placement.
struct TokenStrides {
  std::int64_t q = 0, k = 0, v = 0, o = 0, stats = 0;
};

/// Device arrays cuDNN reads for a plan of `plan_batch` entries: lengths (int32 [plan_batch]) and
/// element offsets of each entry's first token (int64 [plan_batch + 1]).
struct RaggedArrays {
  std::int32_t* seq_len_q = nullptr;
  std::int32_t* seq_len_kv = nullptr;
  std::int64_t* offset_q = nullptr;
  std::int64_t* offset_k = nullptr;
  std::int64_t* offset_v = nullptr;
  std::int64_t* offset_o = nullptr;
  std::int64_t* offset_stats = nullptr;

  /// Bytes of scratch the arrays take for `plan_batch` entries, and their places in it.
  static std::size_t bytes(std::int64_t plan_batch) noexcept;
  static RaggedArrays in(void* scratch, std::int64_t plan_batch) noexcept;
};

/// One kernel: lengths from the cumulative counts, offsets from the (padded) starts times each
/// placement's token stride. Entries from `ragged.sequences` to plan_batch - 1 get length 0 and
/// start where the last sequence's room ends. Throws CudaError if the launch fails.
void prepare_ragged(const RaggedTensors& ragged, std::int64_t plan_batch, const TokenStrides& strides,
                    const RaggedArrays& out, cudaStream_t stream);

}  // namespace fusedattn::detail
