// The copies around an FP8 backward whose grouped K/V heads run ungrouped (kv_expansion.h): K and V
// repeated per query head before, each group's dK and dV summed after: grid-stride loops over the
// output in chunks of 16 bytes (the policy keeps K and V of other layouts grouped).
#include "exec/kv_expansion.h"

#include <cstdint>

#include "exec/cuda_check.h"
#include "exec/device.h"
#include "exec/element_conversions.cuh"
#include "exec/environment_switch.h"
#include "exec/strided_elements.cuh"
#include "fusedattn/errors.h"
#include "graph/sdpa_graph.h"

namespace fusedattn::detail {
namespace {

constexpr int kThreads = 256;

// The kernels move chunks of 16 consecutive bytes along d (one 128-bit access each), which the
// policy makes sure every stride but d's, the head dim and the pointers allow. Strides are in chunks.
constexpr int kBytes = 16;
struct alignas(kBytes) Chunk {
  std::uint8_t bytes[kBytes];
};

struct ChunkedShape {
  std::int64_t heads, seq, chunks;  // chunks per row of d
  std::int64_t n;                   // chunks in all
};

// Chunk x of the [b, s, h, chunk] order (heads before positions: a bshd tensor's own order, so a
// warp's accesses are consecutive there) as its indices.
struct ChunkIndex {
  std::int64_t b, h, s, c;
};
__device__ ChunkIndex chunk_index(const ChunkedShape& shape, std::int64_t x) {
  ChunkIndex i;
  i.c = x % shape.chunks;
  x /= shape.chunks;
  i.h = x % shape.heads;
  x /= shape.heads;
  i.s = x % shape.seq;
  i.b = x / shape.seq;
  return i;
}

__device__ std::int64_t offset_of(const Strided& t, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t c) {
  return b * t.strides[kBatch] + h * t.strides[kHead] + s * t.strides[kSeq] + c;
}

__global__ void expand_kernel(Strided src_t, Strided dst_t, ChunkedShape shape, std::int64_t group,
                              const Chunk* src, Chunk* dst) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < shape.n; x += step) {
    const ChunkIndex i = chunk_index(shape, x);
    dst[offset_of(dst_t, i.b, i.h, i.s, i.c)] = src[offset_of(src_t, i.b, i.h / group, i.s, i.c)];
  }
}

template <class T>
__global__ void sum_groups_kernel(Strided src_t, Strided dst_t, ChunkedShape shape, std::int64_t group,
                                  const Chunk* src, Chunk* dst, const float* scale, unsigned int* amax) {
  static_assert(sizeof(T) == 1, "FP8 elements");
  const float descale = 1.0f / *scale;
  unsigned int mine = 0;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < shape.n; x += step) {
    const ChunkIndex i = chunk_index(shape, x);
    float sum[kBytes] = {};  // of the stored values: every group member is at dst's scale
    for (std::int64_t g = 0; g < group; ++g) {
      const Chunk part = src[offset_of(src_t, i.b, i.h * group + g, i.s, i.c)];
#pragma unroll
      for (int e = 0; e < kBytes; ++e) sum[e] += to_float(T{part.bytes[e]});
    }
    Chunk out;
#pragma unroll
    for (int e = 0; e < kBytes; ++e) {
      mine = max(mine, abs_bits(sum[e] * descale));
      out.bytes[e] = from_float<T>(sum[e]).bits;
    }
    dst[offset_of(dst_t, i.b, i.h, i.s, i.c)] = out;
  }
  block_max_into<kThreads>(mine, amax);
}

void require_chunks(const char* field, const TensorDesc& desc, const void* data) {
  if (!in_16_byte_rows(desc) || reinterpret_cast<std::uintptr_t>(data) % kBytes != 0) {
    throw InvalidArgument(field, to_string(desc),
                          "rows of d in 16-byte units: 16-byte aligned data, head dim and strides (but d's)");
  }
}

// A descriptor's strides in chunks (d's stride is 1: validate requires it).
Strided in_chunks(const TensorDesc& desc) {
  Strided t = make_strided(desc);
  const std::int64_t size = static_cast<std::int64_t>(size_of(desc.dtype));
  for (int axis : {kBatch, kHead, kSeq}) t.strides[axis] = t.strides[axis] * size / kBytes;
  return t;
}

ChunkedShape chunked(const TensorDesc& out) {
  const std::int64_t chunks = out.head_dim() * static_cast<std::int64_t>(size_of(out.dtype)) / kBytes;
  return ChunkedShape{out.heads(), out.seq(), chunks, out.batch() * out.heads() * out.seq() * chunks};
}

void launch_expand(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst, std::int64_t group,
                   cudaStream_t stream) {
  const ChunkedShape shape = chunked(dst_desc);
  expand_kernel<<<grid_stride_blocks(shape.n, kThreads), kThreads, 0, stream>>>(
      in_chunks(src_desc), in_chunks(dst_desc), shape, group, static_cast<const Chunk*>(src),
      static_cast<Chunk*>(dst));
}

template <class T>
void launch_sum(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst, std::int64_t group,
                const float* scale, float* amax, cudaStream_t stream) {
  const ChunkedShape shape = chunked(dst_desc);
  sum_groups_kernel<T><<<grid_stride_blocks(shape.n, kThreads), kThreads, 0, stream>>>(
      in_chunks(src_desc), in_chunks(dst_desc), shape, group, static_cast<const Chunk*>(src),
      static_cast<Chunk*>(dst), scale, reinterpret_cast<unsigned int*>(amax));
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
  require_chunks("src_desc", src_desc, src);
  require_chunks("dst_desc", dst_desc, dst);
  if (dst_desc.elements() == 0) return;
  launch_expand(src_desc, src, dst_desc, dst, dst_desc.heads() / src_desc.heads(), stream);
  check_cuda(cudaGetLastError(), "expand_kv_heads");
}

void sum_kv_head_groups(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                        const float* scale, float* amax, cudaStream_t stream) {
  require_grouping(dst_desc, src_desc, "src_desc");
  if (!is_fp8(src_desc.dtype)) throw InvalidArgument("src_desc.dtype", to_string(src_desc.dtype), "e4m3 or e5m2");
  require_chunks("src_desc", src_desc, src);
  require_chunks("dst_desc", dst_desc, dst);
  if (dst_desc.elements() == 0) return;
  const std::int64_t group = src_desc.heads() / dst_desc.heads();
  if (src_desc.dtype == DType::e4m3) {
    launch_sum<E4M3>(src_desc, src, dst_desc, dst, group, scale, amax, stream);
  } else {
    launch_sum<E5M2>(src_desc, src, dst_desc, dst, group, scale, amax, stream);
  }
  check_cuda(cudaGetLastError(), "sum_kv_head_groups");
}

bool expands_kv_heads_on(const AttentionSpec& spec, Pass pass, int device) {
  // FUSEDATTN_KV_EXPANSION=0 keeps every backward grouped (read once: plans built either way must
  // not meet in one cache); the benchmark times both ways with it.
  static const bool allowed = switch_on_unless_zero("FUSEDATTN_KV_EXPANSION");
  return allowed && expands_kv_heads(spec, pass, multiprocessor_count(device));
}

KvExpansion::KvExpansion(const AttentionSpec& spec)
    : k_(spec.k), v_(spec.v), d_k_(gradient_desc(spec.k, spec)), d_v_(gradient_desc(spec.v, spec)),
      layout_(kv_expansion_layout(spec)) {
  const AttentionSpec expanded = kv_expanded_spec(spec);
  expanded_k_ = expanded.k;
  expanded_v_ = expanded.v;
  expanded_d_k_ = gradient_desc(expanded.k, spec);  // the partials come in the gradients' format
  expanded_d_v_ = gradient_desc(expanded.v, spec);
}

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
  sum_kv_head_groups(expanded_d_k_, scratch + layout_.d_k, d_k_, t.d_k, t.fp8.scale_d_k, t.fp8.amax_d_k, stream);
  sum_kv_head_groups(expanded_d_v_, scratch + layout_.d_v, d_v_, t.d_v, t.fp8.scale_d_v, t.fp8.amax_d_v, stream);
}

}  // namespace fusedattn::detail
