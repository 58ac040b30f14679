// Internal: fusedattn's own decode kernel as a plan runs it (the rule: support/decode_kernel_rule.h;
// the kernel: decode_kernel_body.cuh). One launch over (chunk, K/V head, sequence) blocks. A call cut
// into several chunks is merged in the kernel where each (K/V head, sequence)'s chunks form a cluster
// of blocks (decode_cluster_merge.cuh), else by the library's one merge kernel (decode_merge.h),
// launched early behind it; all on the caller's stream, lengths and descales read on the device, so
// a captured call replays with new ones. O is zero in rows past a sequence's queries, and a row that
// sees no key is O 0 with a log-sum-exp of -inf, as the references define.
#pragma once

#include <cstddef>
#include <optional>

#include <cuda_runtime_api.h>

#include "fusedattn/attention.h"
#include "support/decode_kernel_rule.h"

namespace fusedattn::detail {
namespace decode {
struct Params;
}

/// The shape the kernel runs `spec` in on `device`, or nothing where cuDNN's path does: a call the
/// kernel is the only path for (decode_kernel_only: an FP8 K/V cache, a softcap, a sink or
/// off-by-one on one query row or over a paged cache) always where the kernel takes it; another
/// where decode_kernel_preferred says so,
/// unless FUSEDATTN_DECODE_KERNEL (read once) says otherwise: 0 never (cuDNN's path wherever it
/// takes the call), 1 wherever the kernel takes it (the benchmark times both ways with it).
/// FUSEDATTN_DECODE_CHUNKS=n (read once) cuts every call the kernel runs into n chunks where they fit
/// (decode_kernel_cut), for measuring the cuts.
std::optional<DecodeKernelShape> decode_kernel_in_use(const AttentionSpec& spec, Pass pass, int device);

class DecodeKernelCall {
 public:
  /// Finds the kernel for the spec's dtypes, head dim and shape, and lets it have its shared
  /// memory (cudaFuncSetAttribute, once per plan). Throws CudaError if that fails. A shape whose
  /// clusters the device cannot hold (clusters_fit) leaves its chunks to the merge kernel.
  DecodeKernelCall(const AttentionSpec& spec, const DecodeKernelShape& shape);
  /// The partials' float32 O and statistics for the merge kernel (none for one chunk, or chunks
  /// merged in their cluster).
  std::size_t workspace_bytes() const noexcept { return partial_o_bytes_ + partial_stats_bytes_; }
  const DecodeKernelShape& shape() const noexcept { return shape_; }

  /// Enqueues the kernel (and the merge). `t` was checked against the spec (tensor_set.h).
  void forward(const ForwardTensors& t, float scale, cudaStream_t stream, char* workspace) const;

 private:
  AttentionSpec spec_;
  DecodeKernelShape shape_;
  void (*kernel_)(decode::Params);  // the instance for the spec's dtypes, head dim and rows
  std::optional<DecodeSoftcap> softcap_;  // the spec's score modifier, where it has one
  std::size_t partial_o_bytes_ = 0, partial_stats_bytes_ = 0;
  bool early_launch_ = false;
  int page_shift_ = -1;  // log2 of a paged call's page size where it is a power of two
};

}  // namespace fusedattn::detail
