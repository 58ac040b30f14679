// bench/forward_call.h — a forward call on the caller's tensors, prepared once for the timed loops.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "fusedattn/attention.h"
#include "fusedattn/spec.h"
#include "testing/device_buffer.h"

namespace fusedattn::bench {

/// The spec as the caller sent it, with stats on exactly when the call writes them: the
/// forward-only timing compares against PyTorch inference, which writes no statistics either.
inline AttentionSpec spec_for(const std::string& text, bool stats) {
  AttentionSpec spec = parse_spec(text);
  spec.stats = stats;
  validate(spec);
  return spec;
}

/// The caller's scale, or the spec's default (1 / sqrt(d_qk)) when there is none.
inline float scale_for(const AttentionSpec& spec, std::optional<float> scale) {
  return scale ? *scale : default_scale(spec);
}

/// One workspace per plan, allocated on first use and kept, so no timed call allocates. The map
/// holds the plan too: a plan dropped from the cache (plan_build_ms clears it) must not free its
/// address for a new plan that would then inherit a workspace of the wrong size.
inline Workspace workspace_for(const std::shared_ptr<const Plan>& plan) {
  struct Entry {
    std::shared_ptr<const Plan> plan;
    check::DeviceBuffer buffer;
  };
  static std::mutex mutex;
  static std::map<const Plan*, Entry> entries;
  std::lock_guard<std::mutex> lock(mutex);
  Entry& entry = entries[plan.get()];
  if (!entry.plan) entry = Entry{plan, check::DeviceBuffer(plan->workspace_bytes())};
  return Workspace{entry.buffer.get(), entry.buffer.bytes()};
}

/// Everything a timed forward loop passes, resolved before the loop.
struct ForwardCall {
  AttentionSpec spec;
  std::shared_ptr<const Plan> plan;
  ForwardTensors tensors;
  Workspace workspace;
  float scale = 0.0f;
  cudaStream_t stream = nullptr;
};

/// The forward call of `spec_text` on `tensors` (stats written when tensors.stats is set), its
/// plan looked up (built on first use) and its workspace kept.
inline ForwardCall prepare_forward(const std::string& spec_text, const ForwardTensors& tensors,
                                   std::optional<float> scale, cudaStream_t stream) {
  ForwardCall call;
  call.spec = spec_for(spec_text, tensors.stats != nullptr);
  call.plan = get_plan(call.spec, Pass::forward);
  call.tensors = tensors;
  call.workspace = workspace_for(call.plan);
  call.scale = scale_for(call.spec, scale);
  call.stream = stream;
  return call;
}

}  // namespace fusedattn::bench
