// The library's one merge of partial attention results (decode_merge.h): one block per query row.
#include "exec/decode_merge.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "exec/cuda_check.h"
#include "exec/decode_launch.cuh"
#include "exec/element_conversions.cuh"
#include "exec/environment_switch.h"
#include "exec/strided_elements.cuh"

namespace fusedattn::detail {
namespace {

constexpr int kMergeThreads = 256;  // a row's d_v / 8 column packs (d_v <= 256) times the chunk groups
// Columns of a partial O a merge thread loads at once: 16 bytes of 16-bit partials. The partials
// are dense buffers, 256-byte aligned, and validation holds d_v to a multiple of 8.
constexpr int kMergePack = 8;
// Partial packs a merge thread loads before the chunks' weights are known: every partial of a row
// wherever a row has at most 4 chunks per group of threads (on an H200 every split of
// decode_split.h: b = 1 takes 32 chunks, 2 for each of 16 groups of 16 threads at d_v = 128).
constexpr int kMergeAhead = 4;

__device__ inline float to_float(float x) { return x; }

// `x` reduced by `op` over the warp, in every lane.
template <class Op>
__device__ float warp_reduce(float x, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// kMergePack elements of a partial O, loaded at once (16 bytes of 16-bit partials, 32 of float32).
template <class E>
struct alignas(sizeof(E) * kMergePack) Pack {
  E x[kMergePack];
};

// One block per row (i, head, r) of the caller's O: the partials of the chunks with keys merged by
// their log-sum-exp. Each chunk's weight is computed once, in shared memory; then the block's
// threads are groups of d_v / 8, each group summing every groups-th chunk 8 columns at a time,
// and the groups' sums are added in shared memory. (A thread a column walking all chunks took 4.7-7.5
// µs at b = 1 and 32-35 chunks, one a thread an element 17-25 µs.) The chunks' partials are folded
// (decode_chunks_spec): dense bshd [entries, s_q * g, h / g, d_v], statistics [entries, h / g,
// s_q * g], query r of head k * g + j at row r * g + j of head k; the masked call's are dense bshd
// [b, s_q, h, d_v] and [b, h, s_q]. A row whose chunks have no keys (or a statistic that is not
// finite) gets 0 and a log-sum-exp of -inf, as the references give a row that sees no key; a dense
// row past its sequence's queries gets 0, and so does a ragged sequence's padded gap. Ragged O and
// statistics are by token: row r of sequence i is token start[i] + r. Partials in E: O's dtype T
// (cuDNN's) or float32 (the decode kernel's). Chunks without `len_kv_chunks` are judged by their
// statistic alone. A sink (or off-by-one's zero logit) adds its term to the denominator once: a row
// without keys then gets O 0 and the sink's log-sum-exp, as the references give it.
template <class T, class E>
__global__ void merge_kernel(Strided o, T* out, float* stats, const E* o_chunks, const E* o_masked,
                             const float* stats_chunks, const float* stats_masked, const std::int32_t* len_q,
                             RaggedRows ragged, const std::int32_t* len_kv_chunks,
                             const std::int32_t* len_kv_masked, std::int64_t chunks, std::int64_t group,
                             const float* sink, bool off_by_one) {
  wait_for_the_previous_kernel();
  extern __shared__ float shared[];
  float* weights = shared;               // chunks + 1 (the masked call's last)
  float* totals = weights + chunks + 1;  // the largest log-sum-exp, the sum of the weights
  float* sums = totals + 2;              // groups * d_v
  using P = Pack<E>;
  constexpr int kPer = kMergePack;
  const std::int64_t h = o.dims[1], s = o.dims[2], d = o.dims[3];
  const std::int64_t row_id = blockIdx.x, r = row_id % s, head = row_id / s % h, i = row_id / s / h;
  const std::int64_t folded_row = r * group + head % group, kv_head = head / group;
  const std::int64_t chunk_stats_row = kv_head * s * group + folded_row, stats_row = head * s + r;
  const std::int64_t packs = d / kPer, groups = blockDim.x / packs;  // d / kPer <= blockDim.x (host)
  const std::int64_t pack = threadIdx.x % packs, my_group = threadIdx.x / packs;
  const E* first = o_chunks + ((i * chunks * s * group + folded_row) * (h / group) + kv_head) * d + pack * kPer;
  const std::int64_t chunk_stride = s * h * d;  // one entry's partial O
  // Every load that depends on no other is issued first, before any is used: the row's length and
  // this thread's first partials here, the chunks' lengths and statistics by the first warp right
  // after. A chunk without keys has a statistic and a partial that were never written: read, then
  // given the weight 0 and skipped. (Loaded one after another, each waiting on the last, they made
  // most of the merge's time.)
  const bool is_ragged = ragged.cu_q != nullptr;
  const int queries =
      is_ragged ? count_of(ragged.cu_q, i, ragged.sequences) : queries_of(len_q, i, static_cast<int>(s));
  const std::int64_t used = min(i, static_cast<std::int64_t>(ragged.sequences));
  const std::int64_t first_row = is_ragged ? ragged.start[used] : 0;  // a ragged sequence's, in tokens
  const std::int64_t room = is_ragged && i < ragged.sequences ? ragged.start[i + 1] - first_row : 0;
  const bool has_masked = o_masked != nullptr;
  P ahead[kMergeAhead];
#pragma unroll
  for (int k = 0; k < kMergeAhead; ++k) {
    const std::int64_t c = my_group + k * groups;
    if (my_group < groups && c < chunks) ahead[k] = *reinterpret_cast<const P*>(first + c * chunk_stride);
  }
  auto row_of = [&](std::int64_t row) {
    return out + i * o.strides[0] + head * o.strides[1] + (first_row + row) * o.strides[2];
  };
  auto zero = [&](T* row) {
    for (std::int64_t col = threadIdx.x; col < d; col += blockDim.x) row[col * o.strides[3]] = from_float<T>(0.0f);
  };
  // A ragged sequence's rows past its queries are the next one's, but for a padded start's gap,
  // zero as the unsplit call leaves it: this block takes gap rows r, r + s_q, r + 2 s_q, ...
  auto zero_gap = [&] {
    for (std::int64_t row = r; row < room; row += s) {
      if (row >= queries) zero(row_of(row));
    }
  };
  T* target = row_of(r);
  if (r >= queries) {  // the whole block leaves, before any barrier
    if (is_ragged) {
      zero_gap();
    } else {
      zero(target);
      // A padded row's log-sum-exp is -inf, as the references and the unsplit kernels give it.
      if (stats != nullptr && threadIdx.x == 0) stats[i * h * s + stats_row] = -INFINITY;
    }
    return;
  }
  // The first warp weighs the chunks, reducing by shuffles; the block then meets at one barrier (two
  // block-wide reductions took four).
  if (threadIdx.x < 32) {
    float largest = -INFINITY;
    for (std::int64_t c = threadIdx.x; c <= chunks; c += 32) {
      const bool chunk = c < chunks;
      float lse = -INFINITY;
      if (chunk || has_masked) {
        const int keys = !chunk ? len_kv_masked[i] : len_kv_chunks ? len_kv_chunks[i * chunks + c] : 1;
        const float stat =
            chunk ? stats_chunks[(i * chunks + c) * h * s + chunk_stats_row] : stats_masked[i * h * s + stats_row];
        lse = keys > 0 && isfinite(stat) ? stat : -INFINITY;
      }
      weights[c] = lse;
      largest = fmaxf(largest, lse);
    }
    // The softmax's extra logit (a sink, off-by-one's 0) is one more term of the denominator, with no O.
    const float extra = sink != nullptr ? sink[head] : off_by_one ? 0.0f : -INFINITY;
    largest = fmaxf(warp_reduce(largest, [](float a, float b) { return fmaxf(a, b); }), extra);
    float sum = 0.0f;
    for (std::int64_t c = threadIdx.x; c <= chunks; c += 32) {
      const float w = largest > -INFINITY && weights[c] > -INFINITY ? __expf(weights[c] - largest) : 0.0f;
      weights[c] = w;
      sum += w;
    }
    sum = warp_reduce(sum, [](float a, float b) { return a + b; });
    if (threadIdx.x == 0) {
      totals[0] = largest;
      totals[1] = extra > -INFINITY ? sum + __expf(extra - largest) : sum;
    }
  }
  __syncthreads();
  const float largest = totals[0], sum = totals[1];

  if (my_group < groups) {
    float acc[kPer] = {};
    auto add = [&](float w, const P& v) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc[k] += w * to_float(v.x[k]);
    };
#pragma unroll
    for (int k = 0; k < kMergeAhead; ++k) {
      const std::int64_t c = my_group + k * groups;
      if (c < chunks && weights[c] != 0.0f) add(weights[c], ahead[k]);
    }
    for (std::int64_t c = my_group + kMergeAhead * groups; c < chunks; c += groups) {
      const float w = weights[c];
      if (w != 0.0f) add(w, *reinterpret_cast<const P*>(first + c * chunk_stride));
    }
    if (has_masked && my_group == 0 && weights[chunks] != 0.0f) {
      add(weights[chunks], *reinterpret_cast<const P*>(o_masked + ((i * s + r) * h + head) * d + pack * kPer));
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) sums[my_group * d + pack * kPer + k] = acc[k];
  }
  __syncthreads();
  for (std::int64_t col = threadIdx.x; col < d; col += blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t g = 0; g < groups; ++g) acc += sums[g * d + col];
    target[col * o.strides[3]] = from_float<T>(sum > 0.0f ? acc / sum : 0.0f);
  }
  if (stats != nullptr && threadIdx.x == 0) {  // dense [b, h, s_q]; ragged by token, [T, h]
    const std::int64_t at = is_ragged ? (first_row + r) * h + head : i * h * s + stats_row;
    stats[at] = sum > 0.0f ? largest + __logf(sum) : -INFINITY;
  }
  if (is_ragged) zero_gap();
}


// The merge of partials in E into an O of T.
template <class T, class E>
cudaError_t launch_merge(const AttentionSpec& spec, const DecodePartials& p, const std::int32_t* len_q,
                         const RaggedRows& ragged, void* o, float* stats, bool early, cudaStream_t stream) {
  const auto rows = static_cast<unsigned int>(spec.o.elements() / spec.head_dim_v());  // one block each
  // Groups of d_v / 8 threads, no more groups than chunks: with few chunks and many rows (b = 4,
  // 8 queries on an H200: 4 chunks, 1024 rows) idle groups would cost their share of the sums.
  const std::int64_t d_v = spec.head_dim_v(), packs = d_v / kMergePack;
  const std::int64_t wanted = std::min<std::int64_t>(kMergeThreads / packs, p.chunks) * packs;
  const auto threads = static_cast<unsigned int>(std::min<std::int64_t>((wanted + 31) / 32 * 32, kMergeThreads));
  const std::int64_t groups = threads / packs;  // as the kernel counts them
  const std::size_t shared = (static_cast<std::size_t>(p.chunks) + 1 + 2 + groups * d_v) * sizeof(float);
  return launch(merge_kernel<T, E>, early, dim3(rows), threads, shared, stream, make_strided(spec.o),
                static_cast<T*>(o), stats, static_cast<const E*>(p.o), static_cast<const E*>(p.o_masked), p.stats,
                p.stats_masked, len_q, ragged, p.keys, p.keys_masked, p.chunks, p.group, p.sink, p.off_by_one);
}

}  // namespace

void merge_decode_partials(const AttentionSpec& spec, const DecodePartials& partials, const std::int32_t* len_q,
                           const RaggedRows& ragged, void* o, float* stats, bool early, cudaStream_t stream) {
  const bool bf16 = spec.o.dtype == DType::bf16;
  cudaError_t status;
  if (partials.float32) {
    status = bf16 ? launch_merge<__nv_bfloat16, float>(spec, partials, len_q, ragged, o, stats, early, stream)
                  : launch_merge<__half, float>(spec, partials, len_q, ragged, o, stats, early, stream);
  } else {
    status = bf16 ? launch_merge<__nv_bfloat16, __nv_bfloat16>(spec, partials, len_q, ragged, o, stats, early, stream)
                  : launch_merge<__half, __half>(spec, partials, len_q, ragged, o, stats, early, stream);
  }
  check_cuda(status, "decode: merge the chunks");
}

bool decode_early_launch() {
  static const bool enabled = switch_on_unless_zero("FUSEDATTN_DECODE_EARLY_LAUNCH");
  cudaFuncAttributes attributes{};  // every decode kernel is built for the same architectures
  return enabled && cudaFuncGetAttributes(&attributes, merge_kernel<__nv_bfloat16, float>) == cudaSuccess &&
         attributes.binaryVersion >= 90;
}

}  // namespace fusedattn::detail
