// Internal: writes zeros into the rows of an output that lie past each batch entry's length.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fusedattn/tensor.h"

namespace fusedattn::detail {

/// For every batch entry b and head, sets rows lengths[b] .. s-1 of `data` (described by `desc`)
/// to zero, on `stream`. Touches nothing else, so packed gradient buffers keep their neighbours.
/// Throws CudaError if the launch fails.
void zero_rows_past_lengths(const TensorDesc& desc, void* data, const std::int32_t* lengths, cudaStream_t stream);

}  // namespace fusedattn::detail
