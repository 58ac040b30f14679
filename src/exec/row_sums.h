// Internal: a gradient summed over row blocks in float32 (the dQ of exec/causal_composite.h).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fusedattn/tensor.h"

namespace fusedattn::detail {

/// acc (float32, contiguous [b, h, acc_rows, d]) rows first_row .. += the f16/bf16 tensor `block`
/// ([b, h, rows, d], any strides) at `src`; `assign` writes instead of adding.
void accumulate_rows(const TensorDesc& block, const void* src, float* acc, std::int64_t acc_rows,
                     std::int64_t first_row, bool assign, cudaStream_t stream);

/// The f16/bf16 tensor `dst` at `out` = acc (float32, contiguous in dst's logical [b, h, s, d] order),
/// rounded to nearest even.
void store_rows(const float* acc, const TensorDesc& dst, void* out, cudaStream_t stream);

}  // namespace fusedattn::detail
