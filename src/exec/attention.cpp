// The C++ API's entry points: support query, cached plan lookup, one-call forward and backward.
#include "fusedattn/attention.h"

#include <cmath>
#include <string>

#include "exec/device.h"
#include "cache/plan_store.h"
#include "fusedattn/errors.h"
#include "support/policy_only.h"

namespace fusedattn {

float default_scale(const AttentionSpec& spec) noexcept {
  return 1.0f / std::sqrt(static_cast<float>(spec.head_dim_qk()));
}

DeviceCaps current_device_caps() { return detail::device_caps(detail::current_device()); }

Versions current_versions() { return detail::versions(); }

namespace {

// The plan path below the public entries, for a spec they have validated (each entry validates
// once: a plain AttentionSpec here, a ValidatedSpec where it was made; find_or_build does not).
std::shared_ptr<const Plan> plan_of_valid(const AttentionSpec& spec, Pass pass, const PlanOptions& options) {
  auto entry = detail::find_or_build(spec, pass, options);
  if (!entry->support.ok()) {
    throw NotSupported(std::string(to_string(pass)) + " not supported: " + to_string(spec) + "\n" +
                       entry->support.to_string());
  }
  return entry->plan;
}

// Without a GPU there is no cuDNN to ask, but the question still has an answer worth giving: the
// policy's for SM 9.0 (the GPU this library is tuned and tested on), marked as the policy's alone.
Support check_valid(const AttentionSpec& spec, Pass pass) {
  const std::string& absence = detail::gpu_absence();
  if (!absence.empty()) return detail::policy_only_answer(spec, pass, DeviceCaps{9, 0}, detail::versions(), absence);
  return detail::find_or_build(spec, pass)->support;
}

}  // namespace

Support check_support(const AttentionSpec& spec, Pass pass) {
  validate(spec);
  return check_valid(spec, pass);
}

Support check_support(const ValidatedSpec& spec, Pass pass) { return check_valid(spec.spec(), pass); }

Support check_support(const AttentionSpec& spec, Pass pass, const std::string& device) {
  const DeviceCaps caps = detail::device_target(device);
  validate(spec);
  return detail::policy_only_answer(spec, pass, caps, detail::versions(), "device " + device + " named");
}

std::shared_ptr<const Plan> get_plan(const AttentionSpec& spec, Pass pass) { return get_plan(spec, pass, PlanOptions{}); }

std::shared_ptr<const Plan> get_plan(const AttentionSpec& spec, Pass pass, const PlanOptions& options) {
  validate(spec);
  return plan_of_valid(spec, pass, options);
}

std::shared_ptr<const Plan> get_plan(const ValidatedSpec& spec, Pass pass, const PlanOptions& options) {
  return plan_of_valid(spec.spec(), pass, options);
}

namespace {

// The one-call forms know a ragged call's own batch (the plan's is a bucket) and fill it in when
// the caller left it unset; every other call goes to the plan as it is, without a copy.
template <class Tensors>
void run_plan(const AttentionSpec& spec, Pass pass, const Tensors& tensors, float scale, cudaStream_t stream,
              const Workspace& workspace) {
  const std::shared_ptr<const Plan> plan = get_plan(spec, pass);
  if (tensors.ragged.sequences != 0 || (!spec.ragged_q() && !spec.ragged_kv())) {
    plan->run(tensors, scale, stream, workspace);
    return;
  }
  Tensors counted = tensors;
  counted.ragged.sequences = spec.batch();
  plan->run(counted, scale, stream, workspace);
}

}  // namespace

void forward(const AttentionSpec& spec, const ForwardTensors& tensors, float scale, cudaStream_t stream,
             const Workspace& workspace) {
  run_plan(spec, Pass::forward, tensors, scale, stream, workspace);
}

void backward(const AttentionSpec& spec, const BackwardTensors& tensors, float scale, cudaStream_t stream,
              const Workspace& workspace) {
  run_plan(spec, Pass::backward, tensors, scale, stream, workspace);
}

}  // namespace fusedattn
