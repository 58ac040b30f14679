// RawForwardCall: cuDNN's execute with everything else done up front (benchmark baseline).
#include "exec/raw_call.h"

#include <vector>

#include "exec/device.h"
#include "exec/uid_pointers.h"
#include "graph/sdpa_graph.h"

namespace fusedattn {

// Plan keeps its graph private; the benchmark baseline is the one place that reaches past it.
struct PlanAccess {
  static const graph::CompiledGraph& graph(const Plan& plan) { return *plan.graph_; }
};

namespace detail {

struct RawForwardCall::State {
  std::shared_ptr<const Plan> plan;
  float scale;
  std::vector<void*> pointers;
  cudnnHandle_t handle;
  void* workspace;
};

RawForwardCall::RawForwardCall(std::shared_ptr<const Plan> plan, const ForwardTensors& t, float scale,
                               cudaStream_t stream, void* workspace)
    : state_(new State{std::move(plan), scale, {}, nullptr, workspace}) {
  const PointersByUid by_uid = forward_pointers(t, &state_->scale);
  for (std::int64_t uid : PlanAccess::graph(*state_->plan).uids()) state_->pointers.push_back(by_uid.at[uid]);
  state_->handle = handle_for(state_->plan->device(), stream);
}

RawForwardCall::~RawForwardCall() = default;

void RawForwardCall::execute() const {
  PlanAccess::graph(*state_->plan).execute(state_->handle, state_->pointers.data(), state_->workspace);
}

bool RawForwardCall::record(cudaGraph_t into) const {
  return PlanAccess::graph(*state_->plan).record(state_->handle, state_->pointers.data(), state_->workspace, into);
}

}  // namespace detail
}  // namespace fusedattn
