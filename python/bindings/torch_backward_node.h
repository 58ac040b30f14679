// fusedattn._torch_ops's backward of a plain call (torch_ops.cpp) and the autograd node that runs it
// for a training call, so that neither pass of an eager training step runs Python. A header of the module's one
// translation unit, as torch_workspace.h is.
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/version.h>

#include <memory>
#include <string>
#include <utility>

#include "fusedattn/attention.h"
#include "fusedattn/spec.h"
#include "torch_tensors.h"
#include "torch_workspace.h"

// PyTorch's version as one number (2.13: 213), for the two places where its autograd C++ API differs
// between the versions this module builds with (2.11 on): how a node is owned, and creation hooks.
#define FUSEDATTN_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)

namespace fusedattn_torch {

namespace fa = fusedattn;
using torch::autograd::variable_list;

// --- the backward of a plain call ------------------------------------------------------------------

// dQ, dK, dV (with q's, k's and v's strides) of a plain call, from its forward's spec (with the
// statistics), scale, O, statistics and packed sequences (none for a dense call), enqueued on the
// current stream. d_o goes in O's own layout.
inline variable_list run_backward(const fa::ValidatedSpec& spec, float scale, const at::Tensor& grad_o,
                                  const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                                  const at::Tensor& stats, const at::Tensor& mod_scalars,
                                  const Sequences& sequences = {}) {
  const c10::cuda::CUDAGuard device(q.device());
  const at::Tensor d_o = grad_o.is_contiguous() ? grad_o : grad_o.contiguous();
  at::Tensor d_q = empty_like_strided(q), d_k = empty_like_strided(k), d_v = empty_like_strided(v);
  fa::BackwardTensors t;
  t.q = q.data_ptr();
  t.k = k.data_ptr();
  t.v = v.data_ptr();
  t.o = o.data_ptr();
  t.d_o = d_o.data_ptr();
  t.stats = stats.data_ptr<float>();
  t.d_q = d_q.data_ptr();
  t.d_k = d_k.data_ptr();
  t.d_v = d_v.data_ptr();
  t.ragged = sequences.tensors();
  if (mod_scalars.defined()) t.score_mod.scalars = mod_scalars.data_ptr<float>();
  enqueue(*fa::get_plan(spec, fa::Pass::backward), t, scale, q.get_device());
  return {d_q, d_k, d_v};
}

// --- the autograd node of a training call ----------------------------------------------------------

// dQ, dK, dV from the core's backward, with the forward's spec (its plan key drops what the
// backward does not read) and scale. The engine runs it on the forward's stream.
struct AttentionBackward : torch::autograd::Node {
  AttentionBackward(fa::ValidatedSpec spec, float scale) : spec(std::move(spec)), scale(scale) {}

  const fa::ValidatedSpec spec;  // validated by the forward: the backward's get_plan does not again
  const float scale;
  torch::autograd::SavedVariable q, k, v, o, stats;
  at::Tensor mod_scalars;  // a score modifier's scalars (undefined without): read by the backward's plan
  Sequences sequences;     // a packed-sequence call's offsets (none for a dense call), read again

  std::string name() const override { return "fusedattn::AttentionBackward"; }

  variable_list apply(variable_list&& grads) override {
    const at::Tensor& grad_o = grads[0];
    if (!grad_o.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    // getptr(): this node's owning pointer, whichever kind this PyTorch uses.
    return run_backward(spec, scale, grad_o, q.unpack(), k.unpack(), v.unpack(), o.unpack(getptr()), stats.unpack(),
                        mod_scalars, sequences);
  }

  void release_variables() override {
    q.reset_data();
    k.reset_data();
    v.reset_data();
    o.reset_data();
    stats.reset_data();
    mod_scalars.reset();
    sequences = Sequences();
  }
};

// A new AttentionBackward, owned as this PyTorch owns autograd nodes: through std::shared_ptr with
// deleteNode before 2.13, through c10::intrusive_ptr (made by c10::make_intrusive) since. No call
// makes a node in both, so the version decides.
inline auto new_backward_node(const fa::ValidatedSpec& valid, float scale) {
#if FUSEDATTN_TORCH_VERSION >= 213
  return c10::make_intrusive<AttentionBackward>(valid, scale);
#else
  return std::shared_ptr<AttentionBackward>(new AttentionBackward(valid, scale), torch::autograd::deleteNode);
#endif
}

}  // namespace fusedattn_torch
