// The disk cache's form of a frontend plan (plan_payload.h).
#include "graph/plan_payload.h"

namespace fusedattn::graph {
namespace {
constexpr const char* kBackendData = "cudnn_backend_data";
}  // namespace

std::optional<PlanPayload> split_plan_payload(const std::vector<std::uint8_t>& ubjson) {
  nlohmann::json tree = nlohmann::json::from_ubjson(ubjson);
  if (!tree.is_object() || !tree.contains(kBackendData) || !tree[kBackendData].is_string()) return std::nullopt;
  PlanPayload out;
  out.backend = tree[kBackendData].get<std::string>();
  tree.erase(kBackendData);
  out.tree = nlohmann::json::to_ubjson(tree);
  return out;
}

nlohmann::json joined_plan_payload(const std::uint8_t* tree, std::size_t tree_bytes, const char* backend,
                                   std::size_t backend_bytes) {
  nlohmann::json out = nlohmann::json::from_ubjson(tree, tree + tree_bytes);
  if (!out.is_object()) throw nlohmann::json::type_error::create(302, "the plan's tree is not an object", &out);
  out[kBackendData] = std::string(backend, backend_bytes);
  return out;
}

}  // namespace fusedattn::graph
