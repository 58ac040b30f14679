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

/// The frontend graph of `spec`'s `pass`, not yet validated; `uids` gets the UIDs it uses, ascending.
/// The implementation choice applies to the forward (the backward has one).
std::shared_ptr<fe::graph::Graph> frontend_graph(const AttentionSpec& spec, Pass pass,
                                                 fe::AttentionImplementation_t implementation,
                                                 std::vector<std::int64_t>& uids);

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
