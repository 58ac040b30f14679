// Internal to the graph layer: the disk cache's form of a frontend plan. The frontend's plan-only
// serialization is one UBJSON tree whose bulk (about 100 KB on the H200) is one string, the
// backend's own JSON of the execution plan, under "cudnn_backend_data". nlohmann's UBJSON reader
// takes that string byte by byte, a sixth of a restore's time, so the payload keeps the string
// apart from the rest of the tree and puts it back after parsing the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cudnn_frontend/thirdparty/nlohmann/json.hpp"

namespace fusedattn::graph {

struct PlanPayload {
  std::vector<std::uint8_t> tree;  ///< the frontend's tree without the backend's string, UBJSON
  std::string backend;             ///< the backend's plan JSON
};

/// The frontend's plan-only UBJSON apart; nullopt when it holds no backend string (a form this
/// code does not know, which the disk cache then does not store).
std::optional<PlanPayload> split_plan_payload(const std::vector<std::uint8_t>& ubjson);

/// The frontend's tree again: `tree` (UBJSON) parsed, with `backend` put back. Throws nlohmann's
/// parse_error for damaged bytes (load_graph turns that into a refusal).
nlohmann::json joined_plan_payload(const std::uint8_t* tree, std::size_t tree_bytes, const char* backend,
                                   std::size_t backend_bytes);

}  // namespace fusedattn::graph
