// Internal: what one launch of fusedattn's decode kernel reads (decode_kernel_body.cuh), filled by
// the plan from the spec and the call (decode_kernel.cu).
#pragma once

#include <cmath>
#include <cstdint>

namespace fusedattn::detail::decode {

/// Everything a launch reads: pointers, strides (in elements) and sizes.
struct Params {
  const void* q;
  void* o;
  float* stats;                    // dense [b, h_q, s_q], or null
  const void* k;
  const void* v;
  const std::int32_t* table_k;     // [b, pages] page tables; null: contiguous K/V
  const std::int32_t* table_v;
  int page_slots;                  // entries of each table a block keeps in shared memory (a chunk's pages)
  const std::int32_t* len_q;       // [b]; null: s_q every sequence
  const std::int32_t* len_kv;      // [b]; null: s_kv every sequence
  const float* descale_k;          // FP8 K/V: scalars or [h_kv] (descale_step 1); else null
  const float* descale_v;
  int descale_step;
  float* o_part;                   // partials [b * chunks, s_q * g, h_kv, d] (decode_merge.h); null: O itself
  float* stats_part;               // [b * chunks, h_kv, s_q * g]
  bool cluster_merge;              // the chunks are one cluster, merged in its shared memory (o_part null)
  long long q_stride[3], o_stride[3], k_stride[3], v_stride[3];  // batch (a pool's page), head, sequence
  int s_q, s_kv, group, h_kv, pages, page_size, chunk_keys, chunks;
  int page_shift;                  // log2(page_size) where it is a power of two, else -1
  int window_left, window_right;   // -1: no bound
  bool bottom_right;
  float scale_log2;                // the softmax scale times log2(e)
  bool softcapped;                 // a softcap bends every scaled score: cap * tanh(score / cap)
  const float* softcap_scalar;     // its cap on the device (a modifier's scalar), or null
  float softcap;                   // its cap where softcap_scalar is null
  const float* sink;               // softmax=sink: [h_q] logits each adding e^sink to its rows' denominator
  bool off_by_one;                 // softmax=off_by_one: a logit of 0 there
  const void* bias;                // in q's dtype, added to every (softcapped) scaled score; or null
  long long bias_stride[3];        // its batch, head and query strides (0 where broadcast); keys contiguous
};

#ifdef __CUDACC__
// The extra logit of head `head`'s denominator (a sink, off-by-one's 0), -inf: none.
__device__ __forceinline__ float extra_logit(const Params& p, int head) {
  if (p.sink != nullptr) return p.sink[head];
  return p.off_by_one ? 0.0f : -INFINITY;
}
#endif

}  // namespace fusedattn::detail::decode
