// bench/forward_call.h — a forward call on the caller's tensors, prepared once for the timed loops.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include <cuda_runtime_api.h>

#include "testing/device_buffer.h"
#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/spec.h"

namespace fusedattn::bench {

namespace fa = fusedattn;

// The spec as the caller sent it, with stats on exactly when a stats pointer was passed: the
// forward-only timing compares against PyTorch inference, which writes no statistics either.
inline fa::AttentionSpec spec_for(const char* text, bool stats) {
  fa::AttentionSpec spec = fa::parse_spec(text == nullptr ? "" : text);
  spec.stats = stats;
  fa::validate(spec);
  return spec;
}

inline float scale_for(const fa::AttentionSpec& spec, float scale) {
  return std::isnan(scale) ? fa::default_scale(spec) : scale;
}

// One workspace per plan, allocated on first use and kept, so no timed call allocates. The map
// holds the plan too: a plan dropped from the cache (fa_bench_plan_build clears it) must not free
// its address for a new plan that would then inherit a workspace of the wrong size.
inline fa::Workspace workspace_for(const std::shared_ptr<const fa::Plan>& plan) {
  struct Entry {
    std::shared_ptr<const fa::Plan> plan;
    fa::check::DeviceBuffer buffer;
  };
  static std::mutex mutex;
  static std::map<const fa::Plan*, Entry> entries;
  std::lock_guard<std::mutex> lock(mutex);
  Entry& entry = entries[plan.get()];
  if (!entry.plan) entry = Entry{plan, fa::check::DeviceBuffer(plan->workspace_bytes())};
  return fa::Workspace{entry.buffer.get(), entry.buffer.bytes()};
}

struct ForwardCall {
  fa::AttentionSpec spec;
  std::shared_ptr<const fa::Plan> plan;
  fa::ForwardTensors tensors;
  fa::Workspace workspace;
  float scale = 0.0f;
  cudaStream_t stream = nullptr;
};

inline ForwardCall prepare_forward(const char* spec_text, const void* q, const void* k, const void* v, void* o, float* stats,
                            float scale, void* stream) {
  ForwardCall call;
  call.spec = spec_for(spec_text, stats != nullptr);
  call.plan = fa::get_plan(call.spec, fa::Pass::forward);
  call.tensors = fa::ForwardTensors{q, k, v, o, stats};
  call.workspace = workspace_for(call.plan);
  call.scale = scale_for(call.spec, scale);
  call.stream = static_cast<cudaStream_t>(stream);
  return call;
}

}  // namespace fusedattn::bench
