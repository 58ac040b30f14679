// Graph layer interface: builds and runs cuDNN SDPA graphs without exposing the frontend headers.
//
// Only src/graph/ includes cudnn_frontend.h; everything above sees this small interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
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
  // MXFP8 (fusedattn/mxfp8_scales.h): the block scales (E8M0, 128x4 swizzled), the backward's FP8
  // copies, and the amaxes, which come from other pointers than per-tensor FP8's
  kUidSfQ = kUidScoreModTensor0 + kMaxScoreModTensors, kUidSfK, kUidSfV, kUidSfQT, kUidSfKT, kUidSfDO, kUidSfDOT,
  kUidQT, kUidKT, kUidDOFp8, kUidDOT,
  kUidMxfp8AmaxO, kUidMxfp8AmaxDQ, kUidMxfp8AmaxDK, kUidMxfp8AmaxDV,
  kUidEnd  // one past the last
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
  /// The plan as bytes that load_graph restores in another process (the disk cache); empty when
  /// cuDNN cannot serialize its engine.
  virtual std::vector<std::uint8_t> serialize() const = 0;
};

/// A serialize()d plan back on `handle`'s device, or null with cuDNN's or the format's reason.
struct LoadOutcome {
  std::shared_ptr<const CompiledGraph> graph;
  std::string error;
  double parse_ms = 0.0;     ///< reading the frontend's UBJSON into its JSON tree
  double finalize_ms = 0.0;  ///< cuDNN rebuilding the execution plan from it (loading its kernels)
};
LoadOutcome load_graph(const std::vector<std::uint8_t>& bytes, cudnnHandle_t handle);

/// A tensor of a graph as autotune needs it to stand in data: its UID, the bytes its dims and
/// strides reach, and whether it is a host value (the scale) rather than device memory.
struct TensorExtent {
  std::int64_t uid = 0;
  std::size_t bytes = 0;
  bool by_value = false;
};

/// Every plan cuDNN's heuristics offer for one spec and pass, each compiled, for autotune to time
/// (src/exec/autotune.h). Candidate 0 is the one build_graph would have chosen.
class Candidates {
 public:
  virtual ~Candidates() = default;
  virtual int count() const noexcept = 0;
  /// cuDNN's name of the candidate's engine and knobs.
  virtual std::string name(int candidate) const = 0;
  virtual std::size_t workspace_bytes(int candidate) const = 0;
  /// As CompiledGraph::uids(); the same for every candidate.
  virtual const std::vector<std::int64_t>& uids() const noexcept = 0;
  virtual std::vector<TensorExtent> extents() const = 0;
  virtual void execute(int candidate, cudnnHandle_t handle, void** sorted_pointers, void* workspace) const = 0;
  /// The candidate as the plan. Spends the candidates: call it once, last.
  virtual std::shared_ptr<const CompiledGraph> choose(int candidate, cudnnHandle_t handle) = 0;
};

/// The candidates, or cuDNN's reasons for refusing the configuration (never both).
struct CandidatesOutcome {
  std::unique_ptr<Candidates> candidates;
  std::vector<Reason> rejections;
};

/// As build_graph, but compiles every plan the heuristics offer instead of the first one.
CandidatesOutcome build_candidates(const AttentionSpec& spec, Pass pass, cudnnHandle_t handle);

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

/// When this layer's graph code was compiled: a plan written by another build of it may describe
/// another graph under the same spec, so the disk cache's keys carry this.
std::string build_stamp();

}  // namespace fusedattn::graph
