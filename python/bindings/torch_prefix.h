// fusedattn._torch_ops's prefix-LM: flex_attention's schedule for a mask whose first P rows see the
// whole prefix and whose other rows are causal (fusedattn/torch/_flex_run.py's _PrefixOverCausal),
// both passes in C++. Composed in Python, the step cost more host time than its kernels take: eight
// small PyTorch operations around the four attention calls, and three dense copies of the prefix's
// rows for the backward. Here the prefix's call reads and writes the whole tensors' rows in place
// (its spec gives O, and so dO, the whole O's strides; its dQ lands in the whole dQ's rows, which
// have q's strides), leaving one copy of the prefix's statistics, dO's rows zeroed for the causal
// square, and the prefix's dK and dV added to the square's. A header of the module's one
// translation unit, as torch_workspace.h is.
//
// prefix_forward(q, k, v, prefix, whole_id, first_id, scale, mod_scalars) -> (O, statistics, the
// prefix's statistics): the causal square (config whole_id) over q, k, v, then the prefix's square
// (first_id) over their first P positions, whose O and statistics replace the square's rows.
// prefix_backward(d_o, q, k, v, o, stats, first_stats, prefix, whole_id, first_id, scale, mod_scalars)
// -> (dQ, dK, dV) from the forward's outputs. Both give NotImplemented where forward_stats would.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "fusedattn/attention.h"
#include "fusedattn/call.h"
#include "fusedattn/errors.h"
#include "fusedattn/spec.h"
#include "python_errors.h"
#include "torch_backward_node.h"
#include "torch_plain_call.h"
#include "torch_tensors.h"
#include "torch_workspace.h"

namespace fusedattn_torch {

// The prefix's call: its views of q, k, v (the first P positions, so the same addresses), its
// config id and config, and its spec with O's strides those of the whole O `o`.
struct PrefixCall {
  at::Tensor q, k, v;
  int id;
  const fa::CallConfig* config;
  fa::ValidatedSpec valid;
};

// P from `object`: an int with 0 < P < s_q = s_kv (a prefix as long as the sequence is no prefix-LM).
inline std::int64_t prefix_argument(PyObject* object, const at::Tensor& q, const at::Tensor& k) {
  const long long value = PyLong_AsLongLong(object);
  if (PyErr_Occurred()) throw pybind11::error_already_set();
  if (q.size(2) != k.size(2) || value <= 0 || value >= q.size(2)) {
    throw fa::InvalidArgument("prefix", std::to_string(value),
                              "0 < prefix < s_q = s_kv (" + std::to_string(q.size(2)) + ", " +
                                  std::to_string(k.size(2)) + ")");
  }
  return value;
}

// The prefix's call of `whole`'s tensors, or nothing where its config is not a plain one.
inline std::optional<PrefixCall> prefix_call(const PlainArguments& whole, PyObject* first_id, std::int64_t prefix,
                                             const at::Tensor& o) {
  const int id = config_id_argument(first_id);
  const fa::CallConfig& config = fa::registered_config(id);
  if (!plain(config)) return std::nullopt;
  at::Tensor q = whole.q.narrow(2, 0, prefix), k = whole.k.narrow(2, 0, prefix), v = whole.v.narrow(2, 0, prefix);
  fa::AttentionSpec spec = spec_of(q, k, v, config, true).spec();
  for (int axis = 0; axis < 4; ++axis) spec.o.strides[static_cast<std::size_t>(axis)] = o.stride(axis);  // bhsd
  return PrefixCall{q, k, v, id, &config, fa::ValidatedSpec(spec)};
}

inline PyObject* prefix_forward_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  try {
    if (count != 8) {
      throw fa::InvalidArgument("arguments", std::to_string(count),
                                "8: q, k, v, prefix, whole_id, first_id, scale, mod_scalars");
    }
    PyObject* const whole_args[6] = {args[0], args[1], args[2], args[4], args[6], args[7]};  // as forward_stats's
    const std::optional<PlainArguments> whole = plain_arguments(whole_args, 6);
    if (!whole) Py_RETURN_NOTIMPLEMENTED;
    const std::int64_t prefix = prefix_argument(args[3], whole->q, whole->k);
    const ForwardRun square = run_forward(whole->q, whole->k, whole->v, whole->mod_scalars, whole->id, *whole->config,
                                          args[6], true);
    const std::optional<PrefixCall> first = prefix_call(*whole, args[5], prefix, square.o);
    if (!first) Py_RETURN_NOTIMPLEMENTED;
    const c10::cuda::CUDAGuard device(whole->q.device());
    const std::array<const at::Tensor*, 3> inputs = {&first->q, &first->k, &first->v};
    at::Tensor first_stats = allocate(forward_outputs(first->id, *first->config, true).at(1), inputs, at::kFloat);
    fa::ForwardTensors t;
    t.q = first->q.data_ptr();
    t.k = first->k.data_ptr();
    t.v = first->v.data_ptr();
    t.o = square.o.data_ptr();  // the prefix's rows of the whole O, through the spec's strides
    t.stats = first_stats.data_ptr<float>();
    if (whole->mod_scalars.defined()) t.score_mod.scalars = whole->mod_scalars.data_ptr<float>();
    enqueue(*fa::get_plan(first->valid, fa::Pass::forward), t, square.scale, whole->q.get_device());
    square.stats.narrow(2, 0, prefix).copy_(first_stats);
    return tuple_of({square.o, square.stats, first_stats});
  } catch (const fa::Error& error) {
    fa::python::set_python_error(error);
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

inline PyObject* prefix_backward_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  try {
    if (count != 12) {
      throw fa::InvalidArgument("arguments", std::to_string(count),
                                "12: d_o, q, k, v, o, stats, first_stats, prefix, whole_id, first_id, scale, "
                                "mod_scalars");
    }
    const at::Tensor& o = tensor_argument(args[4], "o");
    const at::Tensor& stats = tensor_argument(args[5], "stats");
    const at::Tensor& first_stats = tensor_argument(args[6], "first_stats");
    PyObject* const whole_args[6] = {args[1], args[2], args[3], args[8], args[10], args[11]};
    const std::optional<PlainArguments> whole = plain_arguments(whole_args, 6);
    if (!whole) Py_RETURN_NOTIMPLEMENTED;
    const std::int64_t prefix = prefix_argument(args[7], whole->q, whole->k);
    const std::optional<PrefixCall> first = prefix_call(*whole, args[9], prefix, o);
    if (!first) Py_RETURN_NOTIMPLEMENTED;
    const c10::cuda::CUDAGuard device(whole->q.device());
    // dO in O's layout (the prefix's call reads its rows through O's strides).
    const at::Tensor& grad_o = tensor_argument(args[0], "d_o");
    const at::Tensor d_o = grad_o.strides() == o.strides() ? grad_o : grad_o.contiguous();
    if (d_o.strides() != o.strides()) {
      throw fa::InvalidArgument("o", o.toString(), "the forward's O (dense, in q's axis order)");
    }
    // The square's rows of the prefix give nothing: their dO is 0 (the prefix's call has them).
    at::Tensor rest = at::empty_like(d_o);
    rest.narrow(2, 0, prefix).zero_();
    rest.narrow(2, prefix, d_o.size(2) - prefix).copy_(d_o.narrow(2, prefix, d_o.size(2) - prefix));
    const fa::ValidatedSpec square = spec_of(whole->q, whole->k, whole->v, *whole->config, true);
    const float scale = scale_value(args[10], square.spec());
    variable_list grads = run_backward(square, scale, rest, whole->q, whole->k, whole->v, o, stats, whole->mod_scalars);
    at::Tensor d_k = empty_like_strided(first->k), d_v = empty_like_strided(first->v);
    fa::BackwardTensors t;
    t.q = first->q.data_ptr();
    t.k = first->k.data_ptr();
    t.v = first->v.data_ptr();
    t.o = o.data_ptr();
    t.d_o = d_o.data_ptr();
    t.stats = first_stats.data_ptr<float>();
    t.d_q = grads[0].data_ptr();  // the prefix's rows of the whole dQ (q's strides: run_backward's)
    t.d_k = d_k.data_ptr();
    t.d_v = d_v.data_ptr();
    if (whole->mod_scalars.defined()) t.score_mod.scalars = whole->mod_scalars.data_ptr<float>();
    enqueue(*fa::get_plan(first->valid, fa::Pass::backward), t, scale, whole->q.get_device());
    grads[1].narrow(2, 0, prefix).add_(d_k);
    grads[2].narrow(2, 0, prefix).add_(d_v);
    return tuple_of(grads);
  } catch (const fa::Error& error) {
    fa::python::set_python_error(error);
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

inline PyMethodDef prefix_forward_method = {
    "prefix_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&prefix_forward_call)),
    METH_FASTCALL,
    "prefix_forward(q, k, v, prefix, whole_id, first_id, scale, mod_scalars) -> (O, statistics, the prefix's "
    "statistics) of prefix-LM as the causal square with the prefix's square over its first rows; or "
    "NotImplemented."};

inline PyMethodDef prefix_backward_method = {
    "prefix_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&prefix_backward_call)),
    METH_FASTCALL,
    "prefix_backward(d_o, q, k, v, o, stats, first_stats, prefix, whole_id, first_id, scale, mod_scalars) -> "
    "(dQ, dK, dV) of a prefix_forward call; or NotImplemented."};

}  // namespace fusedattn_torch
