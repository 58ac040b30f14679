// Internal: cuDNN's execute call with nothing of fusedattn around it, for the benchmark that
// reports what the library adds on top of cuDNN's own host cost. Not part of the public API.
#pragma once

#include <memory>

#include <cuda_runtime_api.h>

#include "fusedattn/attention.h"

namespace fusedattn::detail {

/// A forward call with every pointer, the handle and the stream prepared up front.
class RawForwardCall {
 public:
  /// Validates once, resolves the handle for `stream` and lays out the pointer array.
  RawForwardCall(std::shared_ptr<const Plan> plan, const ForwardTensors& tensors, float scale, cudaStream_t stream,
                 void* workspace);
  ~RawForwardCall();
  /// Only the frontend's execute: no validation, lookup, or handle/stream work.
  void execute() const;
  /// Records into the empty CUDA graph `into` what execute() enqueues, as replay does
  /// (src/exec/replay.h); false when the plan's engine cannot be recorded.
  bool record(cudaGraph_t into) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace fusedattn::detail
