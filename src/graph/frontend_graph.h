// Internal to src/graph/: what the graph layer's translation units share. It includes
// cudnn_frontend.h, so nothing outside src/graph/ may include it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cudnn_frontend.h>

#include "graph/sdpa_graph.h"

namespace fusedattn::graph::detail {

namespace fe = cudnn_frontend;

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

/// frontend_graph's target: the current device, which the frontend asks CUDA for at validation.
constexpr int kCurrentDeviceSm = 0;

/// The frontend graph of `spec`'s `pass`, not yet validated; `uids` gets the UIDs it uses, ascending.
/// The implementation choice applies to the forward (the backward has one). `target_sm` (major * 10
/// + minor) builds for that GPU instead of the current device: the frontend copies the graph's
/// target into each node as the node is made, so it must be set here, before the nodes (the CPU
/// tests build for GPUs they do not have).
std::shared_ptr<fe::graph::Graph> frontend_graph(const AttentionSpec& spec, Pass pass,
                                                 fe::AttentionImplementation_t implementation,
                                                 std::vector<std::int64_t>& uids, int target_sm = kCurrentDeviceSm);

/// An input described by `desc` (dims, strides, element type) under `uid`.
fe::graph::Tensor_attributes describe(const char* name, Uid uid, const TensorDesc& desc);

/// `tensor` made a float32 scalar output (an amax) under `uid`, which joins `uids`.
void mark_scalar_output(const TensorPtr& tensor, const char* name, Uid uid, std::vector<std::int64_t>& uids);

/// A frontend stage's failure as a reason naming the stage; true when it succeeded.
bool stage_ok(fe::error_t status, const char* stage, const char* implementation, std::vector<Reason>& rejections);

/// Validates `graph` and lowers it to cuDNN's operation graph (the stages before heuristics).
bool lower(fe::graph::Graph& graph, cudnnHandle_t handle, const char* implementation, std::vector<Reason>& rejections);

/// A compiled frontend graph running its selected plan: what build_graph, load_graph and
/// autotune's choice all return.
class FrontendGraph final : public CompiledGraph {
 public:
  FrontendGraph(std::shared_ptr<fe::graph::Graph> graph, std::vector<std::int64_t> uids, std::size_t workspace)
      : graph_(std::move(graph)), uids_(std::move(uids)), workspace_(workspace) {}

  std::size_t workspace_bytes() const noexcept override { return workspace_; }
  const std::vector<std::int64_t>& uids() const noexcept override { return uids_; }
  void execute(cudnnHandle_t handle, void** sorted_pointers, void* workspace) const override;
  bool record(cudnnHandle_t handle, void** sorted_pointers, void* workspace, cudaGraph_t into) const override;
  std::vector<std::uint8_t> serialize() const override;

 private:
  std::shared_ptr<fe::graph::Graph> graph_;
  std::vector<std::int64_t> uids_;
  std::size_t workspace_;
};

/// The graph's workspace for its selected plan, or CudnnError.
std::size_t workspace_of(const fe::graph::Graph& graph);

/// The candidates of a graph whose plans at `built` compiled (plan_choice.cpp).
std::unique_ptr<Candidates> make_candidates(std::shared_ptr<fe::graph::Graph> graph, std::vector<std::int64_t> uids,
                                            std::vector<std::int64_t> built);

}  // namespace fusedattn::graph::detail
