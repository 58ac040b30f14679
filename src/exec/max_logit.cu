// The max-logit output: cuDNN writes each row's maximum and sum of exponentials; fusedattn forms
// the statistics from them, defines padded rows (-inf) and reduces per head on request, so padded
// positions never contribute.
#include "exec/max_logit.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "fusedattn/errors.h"

namespace fusedattn::detail {
namespace {

constexpr int kThreads = 256;

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw CudaError(std::string(kernel) + " launch failed: " + cudaGetErrorString(status));
}

__device__ std::int64_t valid_rows(const std::int32_t* lengths, std::int64_t b, std::int64_t seq) {
  if (lengths == nullptr) return seq;
  const std::int64_t n = lengths[b];
  return n < 0 ? 0 : (n > seq ? seq : n);
}

// One thread per row: the statistics from the row's max and sum of exponentials, then -inf as the
// max of a row past its length.
__global__ void finish_rows_kernel(float* maxima, float* stats, std::int64_t heads, std::int64_t seq,
                                   std::int64_t rows, const std::int32_t* lengths) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (stats != nullptr) stats[i] = maxima[i] + logf(stats[i]);
    if (lengths != nullptr && i % seq >= valid_rows(lengths, i / (heads * seq), seq)) maxima[i] = -INFINITY;
  }
}

// One block per head: a strided max over the head's valid rows, then a shared-memory tree.
__global__ void reduce_per_head_kernel(const float* rows, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                       const std::int32_t* lengths, float* out) {
  __shared__ float partial[kThreads];
  const std::int64_t h = blockIdx.x;
  float best = -INFINITY;
  for (std::int64_t b = 0; b < batch; ++b) {
    const float* row = rows + (b * heads + h) * seq;
    for (std::int64_t i = threadIdx.x; i < valid_rows(lengths, b, seq); i += blockDim.x) best = fmaxf(best, row[i]);
  }
  partial[threadIdx.x] = best;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[h] = partial[0];
}

}  // namespace

void finish_row_maxima(float* maxima, float* stats, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                       const std::int32_t* lengths, cudaStream_t stream) {
  if (stats == nullptr && lengths == nullptr) return;
  const std::int64_t rows = batch * heads * seq;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((rows + kThreads - 1) / kThreads, 4096));
  finish_rows_kernel<<<blocks, kThreads, 0, stream>>>(maxima, stats, heads, seq, rows, lengths);
  check_launch("finish_row_maxima");
}

void reduce_row_maxima_per_head(const float* rows, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                const std::int32_t* lengths, float* out, cudaStream_t stream) {
  reduce_per_head_kernel<<<static_cast<unsigned>(heads), kThreads, 0, stream>>>(rows, batch, heads, seq, lengths, out);
  check_launch("reduce_row_maxima_per_head");
}

}  // namespace fusedattn::detail
