// Graph layer interface: builds and runs cuDNN SDPA graphs without exposing the frontend headers.
//
// Only sdpa_graph.cpp includes cudnn_frontend.h; everything above sees this small interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn::graph {

/// Fixed tensor UIDs shared by every graph. Execution takes pointers in ascending UID order of
/// the tensors a graph uses, so these numbers also fix the pointer order.
enum Uid : std::int64_t {
  kUidQ = 1, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidDO, kUidDQ, kUidDK, kUidDV, kUidSeqLenQ, kUidSeqLenKV,
  kUidBias, kUidDBias, kUidSink, kUidDSink, kUidMaxLogit, kUidDropoutSeed, kUidDropoutOffset, kUidDropoutMask,
  kUidSumExp,  // with a max logit, cuDNN gives each row's max and sum of exponentials instead of stats
  kUidOffsetQ, kUidOffsetK, kUidOffsetV, kUidOffsetO, kUidOffsetStats,  // ragged: where each sequence starts
  kUidPageTableK, kUidPageTableV,                                        // paged caches: each sequence's pages
  // FP8: the scaling tensors (fusedattn/fp8_scales.h), float32 scalars
  kUidDescaleQ, kUidDescaleK, kUidDescaleV, kUidDescaleO, kUidDescaleDO, kUidDescaleS, kUidDescaleDP,
  kUidScaleS, kUidScaleO, kUidScaleDP, kUidScaleDQ, kUidScaleDK, kUidScaleDV,
  kUidAmaxS, kUidAmaxO, kUidAmaxDQ, kUidAmaxDK, kUidAmaxDV, kUidAmaxDP,
  // The lengths again, as a score modifier's padding mask reads them (the same memory as
  // kUidSeqLenQ / kUidSeqLenKV, described for that mask's own use)
  kUidScoreModSeqLenQ, kUidScoreModSeqLenKV,
  // A score modifier's runtime scalars and tensors, by slot (fusedattn/score_mod.h)
  kUidScoreModScalar0,
  kUidScoreModTensor0 = kUidScoreModScalar0 + kMaxScoreModScalars,
  kUidEnd = kUidScoreModTensor0 + kMaxScoreModTensors  // one past the last
};

/// A built and compiled graph, ready to execute on any thread.
class CompiledGraph {
 public:
  virtual ~CompiledGraph() = default;
  virtual std::size_t workspace_bytes() const noexcept = 0;
  /// UIDs the graph reads or writes, ascending: the order execute() takes pointers in.
  virtual const std::vector<std::int64_t>& uids() const noexcept = 0;
  /// Enqueues the graph on the handle's stream. Throws CudnnError with cuDNN's message.
  virtual void execute(cudnnHandle_t handle, void** sorted_pointers, void* workspace) const = 0;
  /// Records into the empty CUDA graph `into` what execute() would enqueue with these pointers,
  /// pass-by-value scalars taken at their current values. False when the engine cuDNN chose
  /// cannot be recorded this way; throws CudnnError on any other failure. Not to be called on
  /// one graph from two threads at once (the frontend keeps per-graph recording state).
  virtual bool record(cudnnHandle_t handle, void** sorted_pointers, void* workspace, cudaGraph_t into) const = 0;
};

/// The graph, or cuDNN's reasons for refusing the configuration (never both).
struct BuildOutcome {
  std::shared_ptr<const CompiledGraph> graph;
  std::vector<Reason> rejections;
};

/// Builds the forward or backward SDPA graph of `spec` on `handle`'s device: operation graph,
/// heuristics, support check and plan compilation, so that success means it will execute.
/// cuDNN refusals come back as reasons; only a handle or device failure throws.
BuildOutcome build_graph(const AttentionSpec& spec, Pass pass, cudnnHandle_t handle);

/// CUDNN_FRONTEND_VERSION of the headers this layer was compiled with (1.32.0 -> 13200).
int frontend_version() noexcept;

}  // namespace fusedattn::graph
