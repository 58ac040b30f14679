// Zeroing the padded rows of O, dQ, dK and dV (and the gaps between ragged sequences), so that
// padding has one defined value.
//
// cuDNN's documentation leaves what its kernels write past a sequence's length unstated, while
// fusedattn promises zeros there (spec.h). One block per (batch, head) walks only the padded rows,
// so the cost is proportional to the padding, and a fully used batch costs one short launch.
#include "exec/padding_fill.h"

#include <stdexcept>
#include <string>

#include "fusedattn/errors.h"

namespace fusedattn::detail {
namespace {

constexpr int kThreads = 128;

struct Rows {
  std::int64_t heads, seq, dim;
  std::int64_t stride_b, stride_h, stride_s, stride_d;
};

// Element: an unsigned integer of the output's element size (2 bytes: f16, bf16; 1 byte: E4M3,
// E5M2), whose zero is +0.0 in each of those formats.
template <class Element>
__global__ void zero_rows_kernel(Rows r, Element* data, const std::int32_t* lengths) {
  const std::int64_t b = blockIdx.x / r.heads, h = blockIdx.x % r.heads;
  std::int64_t first = lengths[b];
  if (first < 0) first = 0;
  Element* base = data + b * r.stride_b + h * r.stride_h;
  const std::int64_t padded = (r.seq - first) * r.dim;
  for (std::int64_t e = threadIdx.x; e < padded; e += blockDim.x) {
    const std::int64_t s = first + e / r.dim, d = e % r.dim;
    base[s * r.stride_s + d * r.stride_d] = 0;
  }
}

// Ragged: entry b's room runs from offsets[b] to offsets[b + 1] (elements); its tokens past
// lengths[b] up to there are the gap.
template <class Element>
__global__ void zero_gaps_kernel(Rows r, Element* data, const std::int64_t* offsets, const std::int32_t* lengths) {
  const std::int64_t b = blockIdx.x / r.heads, h = blockIdx.x % r.heads;
  std::int64_t first = lengths[b];
  if (first < 0) first = 0;
  const std::int64_t room = (offsets[b + 1] - offsets[b]) / r.stride_s;
  Element* base = data + offsets[b] + h * r.stride_h;
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

Rows rows_of(const TensorDesc& desc) {
  return Rows{desc.heads(), desc.seq(), desc.head_dim(), desc.strides[kBatch], desc.strides[kHead],
              desc.strides[kSeq], desc.strides[kDim]};
}

// Runs `launch` with the unsigned type of desc's element size: strides count elements, so a kernel
// walking 16-bit words over an FP8 tensor would write twice as far as the tensor reaches.
template <class Launch>
void by_element_size(const TensorDesc& desc, const char* what, Launch&& launch) {
  switch (size_of(desc.dtype)) {
    case 1: launch(std::uint8_t{}); break;
    case 2: launch(std::uint16_t{}); break;
    default:
      throw std::logic_error(std::string("fusedattn: ") + what + " of a " + to_string(desc.dtype) +
                             " tensor (outputs are 8 or 16 bits)");
  }
  check_launch(what);
}

}  // namespace

void zero_ragged_gaps(const TensorDesc& desc, void* data, const std::int64_t* offsets, const std::int32_t* lengths,
                      cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(desc.batch() * desc.heads());
  by_element_size(desc, "zero_ragged_gaps", [&](auto element) {
    using Element = decltype(element);
    zero_gaps_kernel<<<blocks, kThreads, 0, stream>>>(rows_of(desc), static_cast<Element*>(data), offsets, lengths);
  });
}

void zero_rows_past_lengths(const TensorDesc& desc, void* data, const std::int32_t* lengths, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(desc.batch() * desc.heads());
  by_element_size(desc, "zero_rows_past_lengths", [&](auto element) {
    using Element = decltype(element);
    zero_rows_kernel<<<blocks, kThreads, 0, stream>>>(rows_of(desc), static_cast<Element*>(data), lengths);
  });
}

}  // namespace fusedattn::detail
