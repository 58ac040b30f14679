// The copies around an FP8 backward whose grouped K/V heads run ungrouped (kv_expansion.h): K and V
// repeated per query head before, each group's dK and dV summed after. Grid-stride loops over the
// logical [b, h, s, d] order of the output, d fastest, so a warp reads and writes consecutive bytes.
#include "exec/kv_expansion.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "exec/cuda_check.h"
#include "exec/device.h"
#include "exec/element_conversions.cuh"
#include "exec/strided_elements.cuh"
#include "fusedattn/errors.h"
#include "graph/sdpa_graph.h"

namespace fusedattn::detail {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;

unsigned int blocks_for(std::int64_t n) {
  const std::int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(wanted < kMaxBlocks ? wanted : kMaxBlocks);
}

// Offset of (b, h, s, d) in a strided tensor.
__device__ std::int64_t offset_of(const Strided& t, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
  return b * t.strides[kBatch] + h * t.strides[kHead] + s * t.strides[kSeq] + d * t.strides[kDim];
}

template <class T>
__global__ void expand_kernel(Strided src_t, Strided dst_t, std::int64_t n, std::int64_t group, const T* src, T* dst) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    std::int64_t rest = x;
    const std::int64_t d = rest % dst_t.dims[kDim];
    rest /= dst_t.dims[kDim];
    const std::int64_t s = rest % dst_t.dims[kSeq];
    rest /= dst_t.dims[kSeq];
    const std::int64_t h = rest % dst_t.dims[kHead];
    const std::int64_t b = rest / dst_t.dims[kHead];
    dst[offset_of(dst_t, b, h, s, d)] = src[offset_of(src_t, b, h / group, s, d)];
  }
}

template <class T>
__global__ void sum_groups_kernel(Strided src_t, Strided dst_t, std::int64_t n, std::int64_t group, const T* src,
                                  T* dst, const float* scale, unsigned int* amax) {
  const float descale = 1.0f / *scale;
  unsigned int mine = 0;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    std::int64_t rest = x;
    const std::int64_t d = rest % dst_t.dims[kDim];
    rest /= dst_t.dims[kDim];
    const std::int64_t s = rest % dst_t.dims[kSeq];
    rest /= dst_t.dims[kSeq];
    const std::int64_t h = rest % dst_t.dims[kHead];
    const std::int64_t b = rest / dst_t.dims[kHead];
    float sum = 0.0f;  // of the stored values: every group member is at the same scale as dst
    for (std::int64_t g = 0; g < group; ++g) sum += to_float(src[offset_of(src_t, b, h * group + g, s, d)]);
    mine = max(mine, abs_bits(sum * descale));
    dst[offset_of(dst_t, b, h, s, d)] = from_float<T>(sum);
  }
  block_max_into<kThreads>(mine, amax);
}

void require_grouping(const TensorDesc& grouped, const TensorDesc& ungrouped, const char* field) {
  const bool same_other_dims = grouped.dims[kBatch] == ungrouped.dims[kBatch] &&
                               grouped.dims[kSeq] == ungrouped.dims[kSeq] && grouped.dims[kDim] == ungrouped.dims[kDim];
  if (!same_other_dims || grouped.heads() <= 0 || ungrouped.heads() % grouped.heads() != 0 ||
      grouped.dtype != ungrouped.dtype || grouped.ragged() || ungrouped.ragged()) {
    throw InvalidArgument(field, to_string(ungrouped),
                          "dense, of the dtype, batch, length and head dim of " + to_string(grouped) +
                              " and a multiple of its heads");
  }
}

}  // namespace

void expand_kv_heads(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                     cudaStream_t stream) {
  require_grouping(src_desc, dst_desc, "dst_desc");
  const std::int64_t n = dst_desc.elements();
  if (n == 0) return;
  const std::int64_t group = dst_desc.heads() / src_desc.heads();
  const Strided s = make_strided(src_desc), d = make_strided(dst_desc);
  if (size_of(src_desc.dtype) == 1) {
    expand_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, d, n, group, static_cast<const std::uint8_t*>(src),
                                                          static_cast<std::uint8_t*>(dst));
  } else {
    expand_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, d, n, group, static_cast<const std::uint16_t*>(src),
                                                          static_cast<std::uint16_t*>(dst));
  }
  check_cuda(cudaGetLastError(), "expand_kv_heads");
}

void sum_kv_head_groups(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                        const float* scale, float* amax, cudaStream_t stream) {
  require_grouping(dst_desc, src_desc, "src_desc");
  if (!is_fp8(src_desc.dtype)) throw InvalidArgument("src_desc.dtype", to_string(src_desc.dtype), "e4m3 or e5m2");
  const std::int64_t n = dst_desc.elements();
  if (n == 0) return;
  const std::int64_t group = src_desc.heads() / dst_desc.heads();
  const Strided s = make_strided(src_desc), d = make_strided(dst_desc);
  auto* bits = reinterpret_cast<unsigned int*>(amax);
  if (src_desc.dtype == DType::e4m3) {
    sum_groups_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, d, n, group, static_cast<const E4M3*>(src),
                                                              static_cast<E4M3*>(dst), scale, bits);
  } else {
    sum_groups_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, d, n, group, static_cast<const E5M2*>(src),
                                                              static_cast<E5M2*>(dst), scale, bits);
  }
  check_cuda(cudaGetLastError(), "sum_kv_head_groups");
}

bool expands_kv_heads_on(const AttentionSpec& spec, Pass pass, int device) {
  // FUSEDATTN_KV_EXPANSION=0 keeps every backward grouped (read once: plans built either way must
  // not meet in one cache); the benchmark times both ways with it.
  static const bool allowed = [] {
    const char* setting = std::getenv("FUSEDATTN_KV_EXPANSION");
    return setting == nullptr || std::string(setting) != "0";
  }();
  return allowed && expands_kv_heads(spec, pass, multiprocessor_count(device));
}

KvExpansion::KvExpansion(const AttentionSpec& spec)
    : k_(spec.k), v_(spec.v), expanded_k_(kv_expanded_spec(spec).k), expanded_v_(kv_expanded_spec(spec).v),
      layout_(kv_expansion_layout(spec)) {}

void KvExpansion::before(const BackwardTensors& t, char* scratch, void** by_uid, cudaStream_t stream) const {
  expand_kv_heads(k_, t.k, expanded_k_, scratch + layout_.k, stream);
  expand_kv_heads(v_, t.v, expanded_v_, scratch + layout_.v, stream);
  by_uid[graph::kUidK] = scratch + layout_.k;
  by_uid[graph::kUidV] = scratch + layout_.v;
  by_uid[graph::kUidDK] = scratch + layout_.d_k;
  by_uid[graph::kUidDV] = scratch + layout_.d_v;
  by_uid[graph::kUidAmaxDK] = scratch + layout_.amax_d_k;
  by_uid[graph::kUidAmaxDV] = scratch + layout_.amax_d_v;
}

void KvExpansion::after(const BackwardTensors& t, const char* scratch, cudaStream_t stream) const {
  sum_kv_head_groups(expanded_k_, scratch + layout_.d_k, k_, t.d_k, t.fp8.scale_d_k, t.fp8.amax_d_k, stream);
  sum_kv_head_groups(expanded_v_, scratch + layout_.d_v, v_, t.d_v, t.fp8.scale_d_v, t.fp8.amax_d_v, stream);
}

}  // namespace fusedattn::detail
