// Internal: an FP8 backward with grouped K/V heads run as one K/V head per query head (why and
// when: support/kv_expansion.h). Before the ungrouped graph runs, K and V are copied to one head
// per query head in the plan's workspace and the graph's K, V, dK, dV and their amaxes are pointed
// there; after it, each group's dK and dV are summed into the caller's tensors, with their amaxes.
#pragma once

#include <cuda_runtime_api.h>

#include "fusedattn/attention.h"
#include "support/kv_expansion.h"

namespace fusedattn::detail {

/// expands_kv_heads for `device`'s SM count, unless FUSEDATTN_KV_EXPANSION=0: whether its plan runs
/// the ungrouped graph. The plan store builds the graph and Plan's constructor lays out the
/// workspace by this one answer.
bool expands_kv_heads_on(const AttentionSpec& spec, Pass pass, int device);

class KvExpansion {
 public:
  explicit KvExpansion(const AttentionSpec& spec);
  std::size_t workspace_bytes() const noexcept { return layout_.bytes; }

  /// Copies t.k, t.v into `scratch` (workspace_bytes() of it) and points by_uid there.
  void before(const BackwardTensors& t, char* scratch, void** by_uid, cudaStream_t stream) const;
  /// Sums each group of the ungrouped dK, dV into t.d_k, t.d_v (their amaxes into t.fp8's, which
  /// start at zero on the stream).
  void after(const BackwardTensors& t, const char* scratch, cudaStream_t stream) const;

 private:
  TensorDesc k_, v_, d_k_, d_v_;        // the caller's (the gradients in their own dtype)
  TensorDesc expanded_k_, expanded_v_, expanded_d_k_, expanded_d_v_;  // kv_expanded_spec's
  KvExpansionLayout layout_;
};

/// dst (h_q heads) = src (h_kv heads, h_q a multiple) with K/V head j repeated for the query heads
/// j * group .. (j + 1) * group - 1. Elements of one or two bytes; any strides.
void expand_kv_heads(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                     cudaStream_t stream);

/// dst (h_kv heads) = fp8(sum of src's heads j * group .. (j + 1) * group - 1), src holding the
/// ungrouped gradient in FP8 at the scale *scale that dst takes too, summed exactly in float32;
/// *amax (zero on the stream before) gets max |sum| / *scale, the gradient's amax.
void sum_kv_head_groups(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                        const float* scale, float* amax, cudaStream_t stream);

}  // namespace fusedattn::detail
