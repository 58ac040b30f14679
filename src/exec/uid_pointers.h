// Internal: a call's device pointers, indexed by the graph's tensor UIDs.
#pragma once

#include "fusedattn/attention.h"
#include "graph/sdpa_graph.h"

namespace fusedattn::detail {

struct PointersByUid {
  void* at[graph::kUidEnd] = {};
};

/// Every pointer of `t` under its UID, and the pass-by-value scale: the one place that maps the
/// tensor sets to UIDs (Plan::run and the benchmark's cuDNN-only call use it).
PointersByUid forward_pointers(const ForwardTensors& t, float* scale);
PointersByUid backward_pointers(const BackwardTensors& t, float* scale);

}  // namespace fusedattn::detail
