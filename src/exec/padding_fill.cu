// Zeroing the padded rows of O, dQ, dK and dV (and the gaps between ragged sequences), so that
// padding has one defined value.
//
// cuDNN's documentation leaves what its kernels write past a sequence's length unstated, while
// fusedattn promises zeros there (spec.h). One block per (batch, head) walks only the padded rows,
// so the cost is proportional to the padding, and a fully used batch costs one short launch.
#include "exec/padding_fill.h"

#include <string>

#include "fusedattn/errors.h"

namespace fusedattn::detail {
namespace {

constexpr int kThreads = 128;

struct Rows {
  std::int64_t heads, seq, dim;
  std::int64_t stride_b, stride_h, stride_s, stride_d;
};

__global__ void zero_rows_kernel(Rows r, std::uint16_t* data, const std::int32_t* lengths) {
  const std::int64_t b = blockIdx.x / r.heads, h = blockIdx.x % r.heads;
  std::int64_t first = lengths[b];
  if (first < 0) first = 0;
  std::uint16_t* base = data + b * r.stride_b + h * r.stride_h;
  const std::int64_t padded = (r.seq - first) * r.dim;
  for (std::int64_t e = threadIdx.x; e < padded; e += blockDim.x) {
    const std::int64_t s = first + e / r.dim, d = e % r.dim;
    base[s * r.stride_s + d * r.stride_d] = 0;  // +0.0 in both f16 and bf16
  }
}

// Ragged: entry b's room runs from offsets[b] to offsets[b + 1] (elements); its tokens past
// lengths[b] up to there are the gap.
__global__ void zero_gaps_kernel(Rows r, std::uint16_t* data, const std::int64_t* offsets, const std::int32_t* lengths) {
  const std::int64_t b = blockIdx.x / r.heads, h = blockIdx.x % r.heads;
  std::int64_t first = lengths[b];
  if (first < 0) first = 0;
  const std::int64_t room = (offsets[b + 1] - offsets[b]) / r.stride_s;
  std::uint16_t* base = data + offsets[b] + h * r.stride_h;
  const std::int64_t gap = (room - first) * r.dim;
  for (std::int64_t e = threadIdx.x; e < gap; e += blockDim.x) {
    const std::int64_t s = first + e / r.dim, d = e % r.dim;
    base[s * r.stride_s + d * r.stride_d] = 0;
  }
}

void check_launch(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw CudaError(std::string(what) + " launch failed: " + cudaGetErrorString(status));
}

}  // namespace

void zero_ragged_gaps(const TensorDesc& desc, void* data, const std::int64_t* offsets, const std::int32_t* lengths,
                      cudaStream_t stream) {
  const Rows rows{desc.heads(), desc.seq(), desc.head_dim(), desc.strides[kBatch], desc.strides[kHead],
                  desc.strides[kSeq], desc.strides[kDim]};
  const std::int64_t blocks = desc.batch() * desc.heads();
  zero_gaps_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(rows, static_cast<std::uint16_t*>(data),
                                                                           offsets, lengths);
  check_launch("zero_ragged_gaps");
}

void zero_rows_past_lengths(const TensorDesc& desc, void* data, const std::int32_t* lengths, cudaStream_t stream) {
  const Rows rows{desc.heads(), desc.seq(), desc.head_dim(), desc.strides[kBatch], desc.strides[kHead],
                  desc.strides[kSeq], desc.strides[kDim]};
  const std::int64_t blocks = desc.batch() * desc.heads();
  zero_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(rows, static_cast<std::uint16_t*>(data),
                                                                           lengths);
  check_launch("zero_rows_past_lengths");
}

}  // namespace fusedattn::detail
