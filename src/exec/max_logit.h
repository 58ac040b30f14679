// Internal: finishing the max-logit output: the statistics, -inf on padded rows, and the per-head
// reduction.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fusedattn::detail {

/// maxima: float32 [batch, heads, seq] row maxima from cuDNN. stats (may be null): the rows' sums
/// of exponentials on entry, the softmax statistics max + log(sum) on return. Writes -inf into the
/// maxima past lengths[b] (lengths may be null: no padding). Throws CudaError if the launch fails.
void finish_row_maxima(float* maxima, float* stats, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                       const std::int32_t* lengths, cudaStream_t stream);

/// out[h] = the largest of rows[b, h, i] over every b and every i < lengths[b] (all i when lengths
/// is null); -inf when there is no such row. One block per head: no atomics, deterministic.
void reduce_row_maxima_per_head(const float* rows, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                const std::int32_t* lengths, float* out, cudaStream_t stream);

}  // namespace fusedattn::detail
