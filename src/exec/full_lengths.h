// Internal: the query lengths of a padded forward whose caller gives none (attention.h: every entry
// uses its s_q rows), written on the stream where cuDNN's padding mask reads them.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fusedattn::detail {

/// lengths[0 .. count) = value, in one launch on `stream`. Throws CudaError if the launch fails.
void fill_lengths(std::int32_t* lengths, std::int64_t count, std::int32_t value, cudaStream_t stream);

}  // namespace fusedattn::detail
