// Internal: writes zeros into the rows of an output that lie past each batch entry's length, and
// into the gaps between ragged sequences.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fusedattn/tensor.h"

namespace fusedattn::detail {

/// For every batch entry b and head, sets rows lengths[b] .. s-1 of `data` (described by `desc`)
/// to zero, on `stream`. Touches nothing else, so packed gradient buffers keep their neighbours.
/// Throws CudaError if the launch fails.
void zero_rows_past_lengths(const TensorDesc& desc, void* data, const std::int32_t* lengths, cudaStream_t stream);

/// Ragged `desc` (batch = the plan's): for every entry b and head, zeroes the tokens past
/// lengths[b] up to where entry b + 1 starts (offsets: int64 [b + 1] elements, as prepared for
/// cuDNN). Entries of length 0 with no room cost nothing. Throws CudaError if the launch fails.
void zero_ragged_gaps(const TensorDesc& desc, void* data, const std::int64_t* offsets, const std::int32_t* lengths,
                      cudaStream_t stream);

}  // namespace fusedattn::detail
