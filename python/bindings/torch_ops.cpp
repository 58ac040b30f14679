// fusedattn._torch_ops: fusedattn.torch's eager calls in C++, where Python costs more than the
// attention itself at small sizes. Built where PyTorch (with CUDA) is installed; fusedattn.torch
// uses it when it is there and takes its Python path when not.
//
// forward(q, k, v, config_id, scale) -> O runs a dense call with no bias, sink, dropout, lengths
// or extra outputs (the caller sends only those), or returns NotImplemented for a call that needs
// PyTorch's machinery (a tensor subclass or wrapper, a dispatch mode, forward-mode AD, a tensor not
// on a GPU): the caller then takes its general path. Under grad mode with an input that requires
// grad it is a training call: the forward also writes the statistics, and O's grad_fn is a C++
// autograd node (AttentionBackward) that runs the core's backward, so neither pass of an eager
// training step runs Python. forward is a plain CPython fast call (pybind11's argument matching
// costs more than the rest).
//
// Per call: the spec from the tensors' sizes and strides and the registered config (fusedattn/
// call.h: the core validates, and its one bounded plan cache finds the plan), O from PyTorch's
// caching allocator in the sizes the core's output table gives (fusedattn/output_shapes.h), a
// workspace (kept per stream while small), and the plan enqueued on the current stream (a repeated
// call replays, src/exec/replay.h). Only the table's answer per config id is kept here.
#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/call.h"
#include "fusedattn/errors.h"
#include "fusedattn/output_shapes.h"
#include "fusedattn/spec.h"
#include "python_errors.h"
#include "torch_backward_node.h"
#include "torch_workspace.h"

namespace fa = fusedattn;
namespace py = pybind11;

namespace {

using fusedattn_torch::AttentionBackward;
using fusedattn_torch::enqueue;
using fusedattn_torch::new_backward_node;

// --- tensors to the core's terms -----------------------------------------------------------------

// q, k or v as the core sees it (runs_here() made sure of a half type and 4 dims).
fa::TensorView view_of(const at::Tensor& t) {
  fa::TensorView view;
  view.dtype = t.scalar_type() == at::kHalf ? fa::DType::f16 : fa::DType::bf16;
  view.rank = 4;
  for (int axis = 0; axis < 4; ++axis) {
    view.sizes[axis] = t.size(axis);
    view.strides[axis] = t.stride(axis);
  }
  return view;
}

// The spec of a dense call on q, k, v: the core builds and validates it, once (get_plan takes the
// ValidatedSpec as it is). It writes the statistics only when training: the backward reads them.
fa::ValidatedSpec spec_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const fa::CallConfig& config,
                          bool training) {
  fa::CallShape shape;
  shape.q = view_of(q);
  shape.k = view_of(k);
  shape.v = view_of(v);
  if (config.options.stats == training) return fa::make_spec(config, shape);
  fa::CallConfig with_stats = config;
  with_stats.options.stats = training;
  return fa::make_spec(with_stats, shape);
}

// --- outputs: sizes from the core's table (fusedattn/output_shapes.h) -----------------------------

// The forward's outputs of a registered config, inference [0] and training [1] (with the
// statistics). The table depends on the config alone, so each id's is kept: ids are bounded
// (call.h), and forward_call holds the GIL throughout, which orders these lookups.
const std::vector<fa::OutputAxes>& forward_outputs(int id, const fa::CallConfig& config, bool training) {
  static std::vector<std::array<std::vector<fa::OutputAxes>, 2>> known;
  if (static_cast<std::size_t>(id) >= known.size()) known.resize(static_cast<std::size_t>(id) + 1);
  std::vector<fa::OutputAxes>& outputs = known[static_cast<std::size_t>(id)][training ? 1 : 0];
  if (outputs.empty()) {
    fa::CallConfig with_stats = config;
    with_stats.options.stats = training;
    outputs = fa::output_axes(with_stats, fa::Pass::forward);
  }
  return outputs;
}

// An output of `type` in the sizes its axis picks name on q, k, v; empty_cuda: straight to the
// caching allocator, without a trip through the dispatcher.
at::Tensor allocate(const fa::OutputAxes& output, const std::array<const at::Tensor*, 3>& inputs,
                    at::ScalarType type) {
  std::array<std::int64_t, 4> sizes{};
  const std::size_t rank = std::min(output.axes.size(), sizes.size());
  for (std::size_t i = 0; i < rank; ++i) {
    const fa::AxisPick pick = output.axes[i];
    sizes[i] = inputs[static_cast<std::size_t>(pick.input)]->size(pick.axis);
  }
  return at::detail::empty_cuda(at::IntArrayRef(sizes.data(), rank), type, inputs[0]->device(), std::nullopt);
}

// Whether forward() takes calls of this config: dense, and no tensor but q, k and v.
bool plain(const fa::CallConfig& config) {
  const fa::AttentionOptions& o = config.options;
  return config.layout != fa::AxisOrder::thd && config.kv_layout == config.layout && o.bias == fa::Bias::none &&
         o.softmax != fa::Softmax::sink && o.dropout == 0.0 && !o.padding && o.max_logit == fa::MaxLogit::none &&
         o.kv_pages == 0;
}

// --- the call ----------------------------------------------------------------------------------------

// Whether a call is one forward() runs itself: plain strided 4-dim f16/bf16 CUDA tensors on one
// device (no subclass, nested tensor, functorch or functionalization wrapper, no forward-mode
// gradient) and no dispatch mode to see the call. Anything else goes the general way, where the
// core's validation names what is wrong in the same words for every adapter.
bool runs_here(PyObject* const* tensors) {
  constexpr c10::DispatchKeySet kWrappers({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                           c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchBatched,
                                           c10::DispatchKey::FuncTorchGradWrapper});
  if (c10::impl::TorchDispatchModeTLS::any_modes_set()) return false;
  const at::Tensor& q = THPVariable_Unpack(tensors[0]);
  for (int i = 0; i < 3; ++i) {
    if (!THPVariable_CheckExact(tensors[i])) return false;
    const at::Tensor& t = THPVariable_Unpack(tensors[i]);
    if (!t.is_cuda() || t.layout() != at::kStrided || t.is_nested() || t.key_set().has_any(kWrappers) ||
        t.dim() != 4 || t.scalar_type() != q.scalar_type() || t.device() != q.device() ||
        (t.scalar_type() != at::kHalf && t.scalar_type() != at::kBFloat16) || t._fw_grad(/*level=*/0).defined()) {
      return false;
    }
  }
  return true;
}

// `scale`: None for the spec's default, 1/sqrt(d_qk).
float scale_value(PyObject* scale, const fa::AttentionSpec& spec) {
  if (scale == Py_None) return fa::default_scale(spec);
  const double value = PyFloat_AsDouble(scale);
  if (PyErr_Occurred()) throw py::error_already_set();
  return static_cast<float>(value);
}

at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int config_id,
                   const fa::CallConfig& config, PyObject* scale_object) {
  const bool training = c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const fa::ValidatedSpec valid = spec_of(q, k, v, config, training);
  const fa::AttentionSpec& spec = valid.spec();
  const float scale = scale_value(scale_object, spec);
  const c10::cuda::CUDAGuard device(q.device());
  // A plain config's forward writes O, and the statistics when training (float32, the core's order).
  const std::vector<fa::OutputAxes>& outputs = forward_outputs(config_id, config, training);
  const std::array<const at::Tensor*, 3> inputs = {&q, &k, &v};
  at::Tensor o = allocate(outputs[0], inputs, q.scalar_type());
  at::Tensor stats;
  fa::ForwardTensors t;
  t.q = q.data_ptr();
  t.k = k.data_ptr();
  t.v = v.data_ptr();
  t.o = o.data_ptr();
  if (training) {
    stats = allocate(outputs.at(1), inputs, at::kFloat);
    t.stats = stats.data_ptr<float>();
  }
  enqueue(*fa::get_plan(valid, fa::Pass::forward), t, scale, q.get_device());
  if (!training) return o;
  const auto node = new_backward_node(valid, scale);
  node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
  torch::autograd::set_history(o, node);
  node->q = torch::autograd::SavedVariable(q, false);
  node->k = torch::autograd::SavedVariable(k, false);
  node->v = torch::autograd::SavedVariable(v, false);
  node->o = torch::autograd::SavedVariable(o, true);
  node->stats = torch::autograd::SavedVariable(stats, false);
#if FUSEDATTN_TORCH_VERSION >= 214
  // torch.autograd.graph.node_creation_hook (2.14 on) sees each node once it is complete, and it is
  // whoever attaches a node that runs the hooks: PyTorch's own operators do so at this point.
  torch::autograd::fire_node_creation_hooks(node);
#endif
  return o;
}

const at::Tensor& tensor_argument(PyObject* object, const char* name) {
  if (!THPVariable_Check(object)) throw fa::InvalidArgument(name, Py_TYPE(object)->tp_name, "a torch.Tensor");
  return THPVariable_Unpack(object);
}

// forward(q, k, v, config_id, scale) as a CPython fast call.
PyObject* forward_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  try {
    if (count != 5) throw fa::InvalidArgument("arguments", std::to_string(count), "5: q, k, v, config_id, scale");
    const at::Tensor& q = tensor_argument(args[0], "q");
    const at::Tensor& k = tensor_argument(args[1], "k");
    const at::Tensor& v = tensor_argument(args[2], "v");
    const long id = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return nullptr;
    const fa::CallConfig& config = fa::registered_config(static_cast<int>(id));
    if (!plain(config) || !runs_here(args)) Py_RETURN_NOTIMPLEMENTED;
    return THPVariable_Wrap(forward(q, k, v, static_cast<int>(id), config, args[4]));
  } catch (const fa::Error& error) {
    fa::python::set_python_error(error);
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

PyMethodDef forward_method = {
    "forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward_call)), METH_FASTCALL,
    "forward(q, k, v, config_id, scale) -> O of a dense call with no bias, sink, dropout, lengths or extra "
    "outputs (scale None: 1/sqrt(d)) on the current stream, differentiable through a C++ autograd node when an "
    "input requires grad; or NotImplemented for a call it leaves to the general path."};

}  // namespace

PYBIND11_MODULE(_torch_ops, m) {
  m.doc() = "fusedattn.torch's eager calls in C++ (inference and training).";
  m.add_object("forward", py::reinterpret_steal<py::object>(PyCFunction_New(&forward_method, nullptr)));
}
