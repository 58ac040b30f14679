// Every entry's query length, for a padded forward called without seq_len_q (full_lengths.h).
#include "exec/full_lengths.h"

#include <algorithm>

#include "exec/cuda_check.h"

namespace fusedattn::detail {
namespace {

constexpr std::int64_t kThreads = 256;

__global__ void fill_lengths_kernel(std::int32_t* lengths, std::int64_t count, std::int32_t value) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) lengths[i] = value;
}

}  // namespace

void fill_lengths(std::int32_t* lengths, std::int64_t count, std::int32_t value, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned int>(std::clamp<std::int64_t>((count + kThreads - 1) / kThreads, 1, 1024));
  fill_lengths_kernel<<<blocks, kThreads, 0, stream>>>(lengths, count, value);
  check_cuda(cudaGetLastError(), "fill_lengths_kernel launch");
}

}  // namespace fusedattn::detail
