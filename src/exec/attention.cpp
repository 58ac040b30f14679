// The C++ API's entry points: support query, cached plan lookup, one-call forward and backward.
#include "fusedattn/attention.h"

#include <cmath>
#include <string>

#include "exec/device.h"
#include "exec/plan_store.h"
#include "fusedattn/errors.h"

namespace fusedattn {

float default_scale(const AttentionSpec& spec) noexcept {
  return 1.0f / std::sqrt(static_cast<float>(spec.head_dim_qk()));
}

DeviceCaps current_device_caps() { return detail::device_caps(detail::current_device()); }

Versions current_versions() { return detail::versions(); }

Support check_support(const AttentionSpec& spec, Pass pass) { return detail::find_or_build(spec, pass)->support; }

std::shared_ptr<const Plan> get_plan(const AttentionSpec& spec, Pass pass) {
  auto entry = detail::find_or_build(spec, pass);
  if (!entry->support.ok()) {
    throw NotSupported(std::string(to_string(pass)) + " not supported: " + to_string(spec) + "\n" +
                       entry->support.to_string());
  }
  return entry->plan;
}

namespace {

// The one-call forms know the call's own batch (the plan's is a bucket): fill it in if unset.
template <class Tensors>
Tensors with_sequences(const AttentionSpec& spec, const Tensors& tensors) {
  Tensors out = tensors;
  if (out.ragged.sequences == 0) out.ragged.sequences = spec.batch();
  return out;
}

}  // namespace

void forward(const AttentionSpec& spec, const ForwardTensors& tensors, float scale, cudaStream_t stream,
             const Workspace& workspace) {
  get_plan(spec, Pass::forward)->run(with_sequences(spec, tensors), scale, stream, workspace);
}

void backward(const AttentionSpec& spec, const BackwardTensors& tensors, float scale, cudaStream_t stream,
              const Workspace& workspace) {
  get_plan(spec, Pass::backward)->run(with_sequences(spec, tensors), scale, stream, workspace);
}

}  // namespace fusedattn
