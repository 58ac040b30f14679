// Internal: the FP8 element kernels' logical walk, for tensor pairs the memory-order path
// (fp8_rows.h) cannot take (bshd into sbhd, views with gaps inside rows): grid-stride loops over
// the [b, h, s, d] order, each element's address from the strides. Checked arguments only (the
// public calls of fp8_scaling.cu check them); each amax must be zero on the stream first.
#pragma once

#include <cuda_runtime_api.h>

#include "fusedattn/fp8.h"

namespace fusedattn::detail {

void walk_logically(const Fp8Amax& tensor, cudaStream_t stream);
void walk_logically(const Fp8Quantization& tensor, cudaStream_t stream);
void walk_logically(const Fp8Dequantization& tensor, cudaStream_t stream);

}  // namespace fusedattn::detail
