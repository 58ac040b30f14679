// Plans beyond one build: serialized for the disk cache and restored from it, and the candidate
// plans autotune times (the timing itself is src/exec/autotune.cpp: no frontend code there).
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "fusedattn/errors.h"
#include "graph/frontend_graph.h"
#include "graph/plan_payload.h"

namespace fusedattn::graph {
namespace fe = cudnn_frontend;
namespace {

// Our part of a serialized plan, before the frontend's bytes: the UIDs and the workspace the plan
// was built with, checked again on loading so that a plan never runs with other pointers.
void put_u64(std::vector<std::uint8_t>& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

bool get_u64(const std::vector<std::uint8_t>& in, std::size_t& at, std::uint64_t& value) {
  if (in.size() < at + 8) return false;
  value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<std::uint64_t>(in[at + i]) << (8 * i);
  at += 8;
  return true;
}

std::size_t element_bytes(fe::DataType_t type) {
  switch (type) {
    case fe::DataType_t::DOUBLE:
    case fe::DataType_t::INT64: return 8;
    case fe::DataType_t::HALF:
    case fe::DataType_t::BFLOAT16: return 2;
    case fe::DataType_t::INT8:
    case fe::DataType_t::UINT8:
    case fe::DataType_t::BOOLEAN:
    case fe::DataType_t::FP8_E4M3:
    case fe::DataType_t::FP8_E5M2:
    case fe::DataType_t::FP8_E8M0: return 1;
    default: return 4;  // float32, int32, and anything narrower gets room to spare
  }
}

class FrontendCandidates final : public Candidates {
 public:
  FrontendCandidates(std::shared_ptr<fe::graph::Graph> graph, std::vector<std::int64_t> uids,
                     std::vector<std::int64_t> built)
      : graph_(std::move(graph)), uids_(std::move(uids)), built_(std::move(built)) {}

  int count() const noexcept override { return static_cast<int>(built_.size()); }
  const std::vector<std::int64_t>& uids() const noexcept override { return uids_; }

  std::string name(int candidate) const override {
    std::string name;
    auto status = graph_->get_plan_name_at_index(index(candidate), name);
    return status.is_good() ? name : "plan " + std::to_string(index(candidate));
  }

  std::size_t workspace_bytes(int candidate) const override {
    std::int64_t bytes = 0;
    auto status = graph_->get_workspace_size_plan_at_index(index(candidate), bytes);
    if (status.is_bad()) throw CudnnError("cuDNN get_workspace_size_plan_at_index failed: " + status.get_message());
    return static_cast<std::size_t>(bytes);
  }

  std::vector<TensorExtent> extents() const override {
    std::vector<TensorExtent> extents;
    for (std::int64_t uid : uids_) {
      fe::graph::Tensor_attributes tensor;
      auto status = graph_->query_tensor_attributes_of_uid(uid, tensor);
      if (status.is_bad()) throw CudnnError("cuDNN query_tensor_attributes_of_uid failed: " + status.get_message());
      std::size_t reach = 1;
      const auto& dims = tensor.get_dim();
      const auto& strides = tensor.get_stride();
      if (tensor.get_reordering_type() != fe::TensorReordering_t::NONE) {
        // MXFP8's block scales fill their padded dims, whatever their strides say: the frontend
        // rewrites SF_Q_T's and SF_K_T's so that one step along the blocks passes every (b, h)
        // matrix (sdpa_fp8_bwd.h:1073-1075), which would reach ~blocks times too far.
        for (std::int64_t dim : dims) reach *= static_cast<std::size_t>(dim);
      } else {
        for (std::size_t i = 0; i < dims.size() && i < strides.size(); ++i) {
          reach += static_cast<std::size_t>(dims[i] - 1) * static_cast<std::size_t>(strides[i]);
        }
      }
      extents.push_back(TensorExtent{uid, reach * element_bytes(tensor.get_data_type()), tensor.get_is_pass_by_value()});
    }
    return extents;
  }

  void execute(int candidate, cudnnHandle_t handle, void** sorted_pointers, void* workspace) const override {
    auto status = graph_->execute_plan_at_index(handle, sorted_pointers, static_cast<int>(uids_.size()), workspace,
                                                index(candidate));
    if (status.is_bad()) throw CudnnError("cuDNN execute_plan_at_index failed: " + status.get_message());
  }

  std::shared_ptr<const CompiledGraph> choose(int candidate, cudnnHandle_t handle) override {
    // Already compiled: building it again only makes it the graph's selected plan, which
    // execute, record and serialize use.
    auto status = graph_->build_plan_at_index(handle, index(candidate));
    if (status.is_bad()) throw CudnnError("cuDNN build_plan_at_index failed: " + status.get_message());
    const std::size_t workspace = detail::workspace_of(*graph_);
    return std::make_shared<detail::FrontendGraph>(std::move(graph_), std::move(uids_), workspace);
  }

 private:
  std::int64_t index(int candidate) const { return built_.at(static_cast<std::size_t>(candidate)); }

  std::shared_ptr<fe::graph::Graph> graph_;
  std::vector<std::int64_t> uids_;
  std::vector<std::int64_t> built_;  // candidate i is the graph's plan built_[i]
};


}  // namespace

namespace detail {

// The payload: [uid count][uids][workspace][tree bytes][tree][backend string] (plan_payload.h).
std::vector<std::uint8_t> FrontendGraph::serialize() const {
  std::vector<std::uint8_t> plan;
  if (graph_->serialize(plan, false).is_bad()) return {};
  const std::optional<PlanPayload> parts = split_plan_payload(plan);
  if (!parts) return {};  // not a form we know: not stored
  std::vector<std::uint8_t> out;
  put_u64(out, uids_.size());
  for (std::int64_t uid : uids_) put_u64(out, static_cast<std::uint64_t>(uid));
  put_u64(out, workspace_);
  put_u64(out, parts->tree.size());
  out.insert(out.end(), parts->tree.begin(), parts->tree.end());
  out.insert(out.end(), parts->backend.begin(), parts->backend.end());
  return out;
}

std::unique_ptr<Candidates> make_candidates(std::shared_ptr<fe::graph::Graph> graph, std::vector<std::int64_t> uids,
                                            std::vector<std::int64_t> built) {
  return std::make_unique<FrontendCandidates>(std::move(graph), std::move(uids), std::move(built));
}

}  // namespace detail

LoadOutcome load_graph(const std::vector<std::uint8_t>& bytes, cudnnHandle_t handle) {
  std::size_t at = 0;
  std::uint64_t count = 0, workspace = 0;
  if (!get_u64(bytes, at, count) || count == 0 || count > static_cast<std::uint64_t>(kUidEnd)) {
    return {nullptr, "the plan's UID count is damaged"};
  }
  std::vector<std::int64_t> uids;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint64_t uid = 0;
    if (!get_u64(bytes, at, uid) || uid == 0 || uid >= static_cast<std::uint64_t>(kUidEnd) ||
        (!uids.empty() && static_cast<std::int64_t>(uid) <= uids.back())) {
      return {nullptr, "the plan's UIDs are damaged"};
    }
    uids.push_back(static_cast<std::int64_t>(uid));
  }
  if (!get_u64(bytes, at, workspace)) return {nullptr, "the plan's workspace size is missing"};
  std::uint64_t tree_bytes = 0;
  if (!get_u64(bytes, at, tree_bytes) || tree_bytes > bytes.size() - at) return {nullptr, "the plan's tree is cut"};
  auto graph = std::make_shared<fe::graph::Graph>();
  LoadOutcome outcome;
  try {
    // Parsed here rather than inside deserialize(), to time the two stages apart (the disk
    // cache's log reports both); the frontend's json overload is what its byte overload calls.
    const auto start = std::chrono::steady_clock::now();
    const std::uint8_t* tree_at = bytes.data() + at;
    const auto tree = joined_plan_payload(tree_at, tree_bytes, reinterpret_cast<const char*>(tree_at + tree_bytes),
                                          bytes.size() - at - tree_bytes);
    const auto parsed = std::chrono::steady_clock::now();
    // No warm-up capture: a freshly built plan gets none either, and its first call loads the kernels.
    auto status = graph->deserialize(handle, tree, false, false);
    outcome.parse_ms = std::chrono::duration<double, std::milli>(parsed - start).count();
    outcome.finalize_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - parsed).count();
    if (status.is_bad()) return {nullptr, "cuDNN deserialize failed: " + status.get_message()};
    if (detail::workspace_of(*graph) != workspace) return {nullptr, "the restored plan asks for another workspace"};
  } catch (const std::exception& error) {  // the JSON reader throws on damaged bytes
    return {nullptr, std::string("cuDNN deserialize failed: ") + error.what()};
  }
  outcome.graph =
      std::make_shared<detail::FrontendGraph>(std::move(graph), std::move(uids), static_cast<std::size_t>(workspace));
  return outcome;
}

}  // namespace fusedattn::graph
