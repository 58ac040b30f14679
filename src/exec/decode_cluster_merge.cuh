// Internal: the decode kernel's merge inside a cluster (decode_kernel_body.cuh with cluster_merge;
// support/decode_kernel_rule.h's decode_cluster_merge says when). The blocks of one (K/V head,
// sequence) are one thread block cluster, a block a chunk of its keys, and each has left its rows'
// partial O (normalized, float32) and natural log-sum-exp in its own shared memory. After a cluster
// barrier each block takes every chunks-th piece of 4 columns of the rows, reads that piece and the
// row's log-sum-exp from each peer's shared memory, and writes O (and the statistic); a second
// barrier keeps each block's memory until its peers have read it. The arithmetic is the merge
// kernel's (decode_merge.cu): weights e^(lse_c - max), the softmax's extra term added once, a row
// that saw no key O 0 with a log-sum-exp of -inf (the extra logit's with a sink), and a row past its
// sequence's queries 0 with -inf.
#pragma once

#include <cooperative_groups.h>

#include "exec/decode_mma.cuh"
#include "exec/decode_params.h"

namespace fusedattn::detail::decode {

// Row r's piece of 4 columns at `column` lies at r / 16 * tile_floats + r % 16 * pitch + column of
// `o_rows`, its log-sum-exp at row_lse[r]; `rows` rows, of which sequence i's first q_len queries
// (s_q each, rows t * g + j) are real.
template <class T, int D, int kThreads>
__device__ void merge_in_cluster(const Params& p, const float* o_rows, int tile_floats, int pitch, const float* row_lse,
                                 int rows, int q_len, int kv, int i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every chunk's rows are in its block's shared memory
  const int chunks = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  constexpr int kColumns = D / 4;
  for (int n = rank * kThreads + static_cast<int>(threadIdx.x); n < rows * kColumns; n += chunks * kThreads) {
    const int row = n / kColumns, column = n % kColumns * 4;
    const int t = row / p.group, head = kv * p.group + row % p.group;
    const int at = row / 16 * tile_floats + row % 16 * pitch + column;
    // One pass over the chunks, rescaling as the running max grows (the extra term starts it).
    float top = extra_logit(p, head), sum = top > -INFINITY ? 1.0f : 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int c = 0; c < chunks; ++c) {
      const float lse = *cluster.map_shared_rank(row_lse + row, c);
      if (lse == -INFINITY) continue;  // a chunk without keys for this row: weight 0, its O unread
      const float4 part = *reinterpret_cast<const float4*>(cluster.map_shared_rank(o_rows + at, c));
      const float next = fmaxf(top, lse), old = __expf(top - next), w = __expf(lse - next);
      sum = sum * old + w;
      acc = make_float4(acc.x * old + w * part.x, acc.y * old + w * part.y, acc.z * old + w * part.z,
                        acc.w * old + w * part.w);
      top = next;
    }
    const bool seen = t < q_len && sum > 0.0f;
    const float f = seen ? 1.0f / sum : 0.0f;
    T* out = static_cast<T*>(p.o) + static_cast<long long>(i) * p.o_stride[0] + head * p.o_stride[1] +
             static_cast<long long>(t) * p.o_stride[2];
    *reinterpret_cast<uint2*>(out + column) = make_uint2(pack<T>(acc.x * f, acc.y * f), pack<T>(acc.z * f, acc.w * f));
    if (column == 0 && p.stats != nullptr) {
      p.stats[(static_cast<long long>(i) * p.h_kv * p.group + head) * p.s_q + t] = seen ? top + __logf(sum) : -INFINITY;
    }
  }
  cluster.sync();  // the peers have read this block's rows
#endif
}

}  // namespace fusedattn::detail::decode
