// fusedattn._torch_ops's tensors in the core's terms (torch_ops.cpp, torch_paged.h): which tensors a
// C++ call takes itself, their views, the outputs' sizes from the core's table, the scale. A header
// of the module's one translation unit, as torch_workspace.h is.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/call.h"
#include "fusedattn/errors.h"
#include "fusedattn/output_shapes.h"

namespace fusedattn_torch {

namespace fa = fusedattn;

// --- which calls run here ------------------------------------------------------------------------

// Whether `object` is a plain strided CUDA tensor: no subclass, nested tensor, functorch or
// functionalization wrapper, no forward-mode gradient. Anything else goes the general way, where
// PyTorch's machinery sees the call and the core's validation names what is wrong in the same words
// for every adapter.
inline bool plain_cuda_tensor(PyObject* object) {
  constexpr c10::DispatchKeySet kWrappers({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                           c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchBatched,
                                           c10::DispatchKey::FuncTorchGradWrapper});
  if (!THPVariable_CheckExact(object)) return false;
  const at::Tensor& t = THPVariable_Unpack(object);
  return t.is_cuda() && t.layout() == at::kStrided && !t.is_nested() && !t.key_set().has_any(kWrappers) &&
         !t._fw_grad(/*level=*/0).defined();
}

// Whether q, k, v (tensors[0..2]) are ones a C++ call runs: plain CUDA tensors of `rank` dims (4, or
// 3 for packed sequences), f16 or bf16 alike, on q's device, and no dispatch mode to see the call.
inline bool attention_inputs_run_here(PyObject* const* tensors, int rank = 4) {
  if (c10::impl::TorchDispatchModeTLS::any_modes_set()) return false;
  const at::Tensor& q = THPVariable_Unpack(tensors[0]);
  for (int i = 0; i < 3; ++i) {
    if (!plain_cuda_tensor(tensors[i])) return false;
    const at::Tensor& t = THPVariable_Unpack(tensors[i]);
    if (t.dim() != rank || t.scalar_type() != q.scalar_type() || t.device() != q.device() ||
        (t.scalar_type() != at::kHalf && t.scalar_type() != at::kBFloat16)) {
      return false;
    }
  }
  return true;
}

// --- tensors to the core's terms -----------------------------------------------------------------

// q, k or v as the core sees it (attention_inputs_run_here made sure of a half type and 4 dims, or 3
// for packed sequences, or torch_paged.h of an FP8 cache's E4M3).
inline fa::TensorView view_of(const at::Tensor& t) {
  fa::TensorView view;
  const at::ScalarType type = t.scalar_type();
  view.dtype = type == at::kHalf ? fa::DType::f16 : type == at::kFloat8_e4m3fn ? fa::DType::e4m3 : fa::DType::bf16;
  view.rank = static_cast<int>(t.dim());
  for (int axis = 0; axis < view.rank; ++axis) {
    view.sizes[axis] = t.size(axis);
    view.strides[axis] = t.stride(axis);
  }
  return view;
}

inline const at::Tensor& tensor_argument(PyObject* object, const char* name) {
  if (!THPVariable_Check(object)) throw fa::InvalidArgument(name, Py_TYPE(object)->tp_name, "a torch.Tensor");
  return THPVariable_Unpack(object);
}

// A call's config id (a Python int), for fusedattn::registered_config.
inline int config_id_argument(PyObject* id) {
  const long value = PyLong_AsLong(id);
  if (PyErr_Occurred()) throw pybind11::error_already_set();
  return static_cast<int>(value);
}

// `scale`: None for the spec's default, 1/sqrt(d_qk).
inline float scale_value(PyObject* scale, const fa::AttentionSpec& spec) {
  if (scale == Py_None) return fa::default_scale(spec);
  const double value = PyFloat_AsDouble(scale);
  if (PyErr_Occurred()) throw pybind11::error_already_set();
  return static_cast<float>(value);
}

// --- packed sequences ------------------------------------------------------------------------------

// A packed-sequence (thd) call's sequences: where they start in q's and in k's tokens (int32
// [count + 1] each, on q's device), how many there are and the longest of each; all empty for a
// dense call. Its backward reads the offsets again.
struct Sequences {
  at::Tensor cu_seqlens_q, cu_seqlens_kv;
  std::int64_t count = 0, max_q = 0, max_kv = 0;

  fa::RaggedTensors tensors() const {
    fa::RaggedTensors ragged;
    if (!cu_seqlens_q.defined()) return ragged;
    ragged.sequences = count;
    ragged.cu_seqlens_q = cu_seqlens_q.data_ptr<std::int32_t>();
    ragged.cu_seqlens_kv = cu_seqlens_kv.data_ptr<std::int32_t>();
    return ragged;
  }
};

// Whether `object` is offsets a C++ call takes beside q: an int32 vector of `count` values, contiguous,
// on q's device (anything else goes the general way, whose checks name what is wrong).
inline bool offsets_run_here(PyObject* object, const at::Tensor& q, std::int64_t count) {
  if (!plain_cuda_tensor(object)) return false;
  const at::Tensor& t = THPVariable_Unpack(object);
  return t.scalar_type() == at::kInt && t.dim() == 1 && t.numel() == count && t.is_contiguous() &&
         t.device() == q.device();
}

// --- outputs: sizes from the core's table (fusedattn/output_shapes.h) -----------------------------

// The forward's outputs of a registered config, inference [0] and training [1] (with the
// statistics). The table depends on the config alone, so each id's is kept: ids are bounded
// (call.h), and the module's calls hold the GIL throughout, which orders these lookups.
inline const std::vector<fa::OutputAxes>& forward_outputs(int id, const fa::CallConfig& config, bool training) {
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
inline at::Tensor allocate(const fa::OutputAxes& output, const std::array<const at::Tensor*, 3>& inputs,
                           at::ScalarType type) {
  std::array<std::int64_t, 4> sizes{};
  const std::size_t rank = std::min(output.axes.size(), sizes.size());
  for (std::size_t i = 0; i < rank; ++i) {
    const fa::AxisPick pick = output.axes[i];
    sizes[i] = inputs[static_cast<std::size_t>(pick.input)]->size(pick.axis);
  }
  return at::detail::empty_cuda(at::IntArrayRef(sizes.data(), rank), type, inputs[0]->device(), std::nullopt);
}

}  // namespace fusedattn_torch
