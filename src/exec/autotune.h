// Internal: autotune's timing (fusedattn/autotune.h): every candidate plan run on stand-in data
// of the spec's shapes, the fastest kept.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fusedattn/spec.h"
#include "graph/sdpa_graph.h"

namespace fusedattn::detail {

struct CandidateTime {
  std::string name;
  double ms = 0.0;  ///< median time of one call; negative when the candidate failed to run
};

struct Tuning {
  std::shared_ptr<const graph::CompiledGraph> graph;  ///< the chosen candidate
  std::vector<CandidateTime> times;                   ///< in the heuristics' order (0: their first choice)
  int chosen = 0;
};

/// Times `candidates` (built for `spec` on `device`) and returns the fastest as the plan. The
/// heuristics' first choice is kept unless another is at least 1% faster, so that noise does not
/// move a plan. Allocates and frees its own memory and stream, and synchronizes them; works while
/// another stream of the process is being captured. Throws CudaError, or CudnnError when no
/// candidate runs.
Tuning autotune(graph::Candidates& candidates, const AttentionSpec& spec, int device);

/// "autotune: 7 plans, heuristics' choice 1.234 ms, chosen 3 (name) 1.100 ms": for the log.
std::string to_string(const Tuning& tuning);

}  // namespace fusedattn::detail
