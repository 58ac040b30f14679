// The disk cache's form of a frontend plan (src/graph/plan_payload.h), without a GPU: a tree shaped
// like the frontend's plan-only serialization comes apart and back together unchanged, a tree
// without the backend's string is not taken, and damaged bytes throw (load_graph refuses them).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph/plan_payload.h"

namespace fusedattn::graph {
namespace {

nlohmann::json frontend_like_tree() {
  nlohmann::json tree;
  tree["json_version"] = "1.0";
  tree["cudnn_backend_data"] = std::string(100000, 'x') + "{\"engine\":7}";
  tree["variant_pack_uids"] = {1, 2, 3, 17};
  tree["behavior_notes"] = nlohmann::json::array({nlohmann::json::array()});
  tree["pass_by_values"] = {{"9", 0.125}};
  tree["fe_workspace_size"] = 4096;
  return tree;
}

TEST(PlanPayload, ComesApartAndBackTogetherUnchanged) {
  const nlohmann::json tree = frontend_like_tree();
  const std::optional<PlanPayload> parts = split_plan_payload(nlohmann::json::to_ubjson(tree));
  ASSERT_TRUE(parts.has_value());
  EXPECT_EQ(parts->backend, tree["cudnn_backend_data"].get<std::string>());
  EXPECT_LT(parts->tree.size(), 200u) << "the rest of the tree is small once the string is out";
  const nlohmann::json back =
      joined_plan_payload(parts->tree.data(), parts->tree.size(), parts->backend.data(), parts->backend.size());
  EXPECT_EQ(back, tree);
}

TEST(PlanPayload, ATreeWithoutTheBackendsStringIsNotTaken) {
  nlohmann::json tree = frontend_like_tree();
  tree.erase("cudnn_backend_data");
  EXPECT_FALSE(split_plan_payload(nlohmann::json::to_ubjson(tree)).has_value());
  tree["cudnn_backend_data"] = 42;  // not a string
  EXPECT_FALSE(split_plan_payload(nlohmann::json::to_ubjson(tree)).has_value());
}

TEST(PlanPayload, DamagedTreeBytesThrow) {
  const std::optional<PlanPayload> parts = split_plan_payload(nlohmann::json::to_ubjson(frontend_like_tree()));
  ASSERT_TRUE(parts.has_value());
  std::vector<std::uint8_t> cut(parts->tree.begin(), parts->tree.begin() + parts->tree.size() / 2);
  EXPECT_THROW(joined_plan_payload(cut.data(), cut.size(), "", 0), nlohmann::json::exception);
  const std::vector<std::uint8_t> number = nlohmann::json::to_ubjson(nlohmann::json(7));
  EXPECT_THROW(joined_plan_payload(number.data(), number.size(), "", 0), nlohmann::json::exception);
}

}  // namespace
}  // namespace fusedattn::graph
