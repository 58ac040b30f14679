// fusedattn._torch_ops: fusedattn.torch's eager calls in C++, where Python costs more than the
// attention itself at small sizes. Built where PyTorch (with CUDA) is installed; fusedattn.torch
// uses it when it is there and takes its Python path when not.
//
// forward(q, k, v, config_id, scale[, mod_scalars]) -> O runs a dense call with no bias, sink,
// dropout, lengths or extra outputs, and no score modifier but one whose only runtime values are
// its scalars (a softcap: float32 [n] on q's device), or returns NotImplemented for a call that needs
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
//
// ragged_forward is forward() over packed sequences (thd with cu_seqlens, as flex_attention's
// document masks and transformers' packed batches call it), its node keeping the offsets.
//
// paged_forward (torch_paged.h) does the same for fusedattn.torch.paged_attention's eager calls, FP8
// caches included; forward_stats and backward run a plain call's two passes with no autograd node,
// for the calls that flex_attention composes, and prefix_forward and prefix_backward (torch_prefix.h)
// its prefix-LM schedule's.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/call.h"
#include "fusedattn/errors.h"
#include "fusedattn/output_shapes.h"
#include "fusedattn/spec.h"
#include "python_errors.h"
#include "torch_backward_node.h"
#include "torch_paged.h"
#include "torch_plain_call.h"
#include "torch_prefix.h"
#include "torch_tensors.h"
#include "torch_workspace.h"

namespace fa = fusedattn;
namespace py = pybind11;

namespace {

using namespace fusedattn_torch;  // the module's own headers

// --- the dense call --------------------------------------------------------------------------------

// O of a plain call (dense, or packed `sequences`), with its autograd node when it is a training call.
at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mod_scalars,
                   int config_id, const fa::CallConfig& config, PyObject* scale_object,
                   const Sequences& sequences = {}) {
  const bool training = c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  ForwardRun run = run_forward(q, k, v, mod_scalars, config_id, config, scale_object, training, sequences);
  if (!training) return run.o;
  const auto node = new_backward_node(run.valid, run.scale);
  node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
  torch::autograd::set_history(run.o, node);
  node->q = torch::autograd::SavedVariable(q, false);
  node->k = torch::autograd::SavedVariable(k, false);
  node->v = torch::autograd::SavedVariable(v, false);
  node->o = torch::autograd::SavedVariable(run.o, true);
  node->stats = torch::autograd::SavedVariable(run.stats, false);
  node->mod_scalars = mod_scalars;  // not a differentiable input: kept as it is
  node->sequences = sequences;      // nor are the offsets
#if FUSEDATTN_TORCH_VERSION >= 214
  // torch.autograd.graph.node_creation_hook (2.14 on) sees each node once it is complete, and it is
  // whoever attaches a node that runs the hooks: PyTorch's own operators do so at this point.
  torch::autograd::fire_node_creation_hooks(node);
#endif
  return run.o;
}

// forward(q, k, v, config_id, scale[, mod_scalars]) as a CPython fast call.
PyObject* forward_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  try {
    if (count != 5 && count != 6) {
      throw fa::InvalidArgument("arguments", std::to_string(count), "5 or 6: q, k, v, config_id, scale[, mod_scalars]");
    }
    const std::optional<PlainArguments> a = plain_arguments(args, count);
    if (!a) Py_RETURN_NOTIMPLEMENTED;
    return THPVariable_Wrap(forward(a->q, a->k, a->v, a->mod_scalars, a->id, *a->config, args[4]));
  } catch (const fa::Error& error) {
    fa::python::set_python_error(error);
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

PyMethodDef forward_method = {
    "forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward_call)), METH_FASTCALL,
    "forward(q, k, v, config_id, scale[, mod_scalars]) -> O of a dense call with no bias, sink, dropout, lengths, "
    "extra outputs or score modifier tensors (scale None: 1/sqrt(d); mod_scalars: the modifier's float32 scalars "
    "on q's device, where it has any) on the current stream, differentiable through a C++ autograd node when an "
    "input requires grad; or NotImplemented for a call it leaves to the general path."};

// --- packed sequences ------------------------------------------------------------------------------

// A positive Python int, or 0 for anything else (the general path then names what is wrong).
std::int64_t positive_argument(PyObject* object) {
  if (!PyLong_Check(object)) return 0;
  const long long value = PyLong_AsLongLong(object);
  if (PyErr_Occurred()) throw pybind11::error_already_set();
  return value > 0 ? value : 0;
}

// ragged_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, config_id, scale,
// mod_scalars) as a CPython fast call: forward() over packed sequences (thd: q, k, v [tokens, h, d]).
PyObject* ragged_forward_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  try {
    if (count != 10) {
      throw fa::InvalidArgument("arguments", std::to_string(count),
                                "10: q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, config_id, "
                                "scale, mod_scalars");
    }
    const at::Tensor& q = tensor_argument(args[0], "q");
    const at::Tensor& k = tensor_argument(args[1], "k");
    const at::Tensor& v = tensor_argument(args[2], "v");
    const int id = config_id_argument(args[7]);
    const fa::CallConfig& config = fa::registered_config(id);
    if (config.layout != fa::AxisOrder::thd || !plain_options(config) || !attention_inputs_run_here(args, 3)) {
      Py_RETURN_NOTIMPLEMENTED;
    }
    Sequences sequences;
    sequences.cu_seqlens_q = tensor_argument(args[3], "cu_seqlens_q");
    sequences.cu_seqlens_kv = tensor_argument(args[4], "cu_seqlens_kv");
    sequences.count = sequences.cu_seqlens_q.numel() - 1;
    sequences.max_q = positive_argument(args[5]);
    sequences.max_kv = positive_argument(args[6]);
    if (sequences.count < 1 || sequences.max_q == 0 || sequences.max_kv == 0 ||
        !offsets_run_here(args[3], q, sequences.count + 1) || !offsets_run_here(args[4], q, sequences.count + 1)) {
      Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject* const plain_args[6] = {args[0], args[1], args[2], args[7], args[8], args[9]};  // as forward's
    const at::Tensor mod_scalars = mod_scalars_argument(plain_args, 6, config, q);
    return THPVariable_Wrap(forward(q, k, v, mod_scalars, id, config, args[8], sequences));
  } catch (const fa::Error& error) {
    fa::python::set_python_error(error);
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

PyMethodDef ragged_forward_method = {
    "ragged_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&ragged_forward_call)),
    METH_FASTCALL,
    "ragged_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, config_id, scale, "
    "mod_scalars) -> O of forward()'s call over packed sequences (thd: [tokens, heads, d] tensors, int32 offsets "
    "of count + 1 values on q's device); or NotImplemented."};

// --- flex_attention's pieces -----------------------------------------------------------------------

// forward_stats(q, k, v, config_id, scale, mod_scalars) -> (O, statistics) and backward(d_o, q, k, v, o,
// stats, config_id, scale, mod_scalars) -> (dQ, dK, dV): a plain call's two passes with no autograd
// node, for callers that compose calls and run their backward themselves (flex_attention's pieces,
// fusedattn/torch/_flex_pieces.py); NotImplemented where forward() would give it. The backward takes
// the forward's tensors as they were (O and dO in O's own layout, the statistics as forward_stats
// gives them, or another call's of the same rows).
PyObject* forward_stats_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  try {
    if (count != 6) {
      throw fa::InvalidArgument("arguments", std::to_string(count), "6: q, k, v, config_id, scale, mod_scalars");
    }
    const std::optional<PlainArguments> a = plain_arguments(args, count);
    if (!a) Py_RETURN_NOTIMPLEMENTED;
    const ForwardRun run = run_forward(a->q, a->k, a->v, a->mod_scalars, a->id, *a->config, args[4], true);
    return tuple_of({run.o, run.stats});
  } catch (const fa::Error& error) {
    fa::python::set_python_error(error);
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

PyObject* backward_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  try {
    if (count != 9) {
      throw fa::InvalidArgument("arguments", std::to_string(count),
                                "9: d_o, q, k, v, o, stats, config_id, scale, mod_scalars");
    }
    const at::Tensor& d_o = tensor_argument(args[0], "d_o");
    const at::Tensor& o = tensor_argument(args[4], "o");
    const at::Tensor& stats = tensor_argument(args[5], "stats");
    PyObject* const forward_args[6] = {args[1], args[2], args[3], args[6], args[7], args[8]};  // as forward_stats's
    const std::optional<PlainArguments> a = plain_arguments(forward_args, 6);
    if (!a) Py_RETURN_NOTIMPLEMENTED;
    const fa::ValidatedSpec valid = spec_of(a->q, a->k, a->v, *a->config, true);
    return tuple_of(run_backward(valid, scale_value(args[7], valid.spec()), d_o, a->q, a->k, a->v, o, stats,
                                 a->mod_scalars));
  } catch (const fa::Error& error) {
    fa::python::set_python_error(error);
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

PyMethodDef forward_stats_method = {
    "forward_stats", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward_stats_call)), METH_FASTCALL,
    "forward_stats(q, k, v, config_id, scale, mod_scalars) -> (O, statistics) of a call forward() takes, with no "
    "autograd node; or NotImplemented."};

PyMethodDef backward_method = {
    "backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&backward_call)), METH_FASTCALL,
    "backward(d_o, q, k, v, o, stats, config_id, scale, mod_scalars) -> (dQ, dK, dV) of a call forward_stats "
    "takes; or NotImplemented."};

// paged_forward(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, seq_len_q, config_id, scale,
// descale_k, descale_v) as a CPython fast call (torch_paged.h).
PyObject* paged_forward_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  try {
    if (count != 11) {
      throw fa::InvalidArgument("arguments", std::to_string(count),
                                "11: q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, seq_len_q, "
                                "config_id, scale, descale_k, descale_v");
    }
    static const char* const kNames[] = {"q", "k_cache", "v_cache", "page_table_k", "page_table_v", "seq_len_kv"};
    for (int i = 0; i < 6; ++i) tensor_argument(args[i], kNames[i]);
    if (args[6] != Py_None) tensor_argument(args[6], "seq_len_q");
    if (args[9] != Py_None) tensor_argument(args[9], "descale_k");
    if (args[10] != Py_None) tensor_argument(args[10], "descale_v");
    const int id = config_id_argument(args[7]);
    const fa::CallConfig& config = fa::registered_config(id);
    if (!paged(config) || !paged_runs_here(args, config)) Py_RETURN_NOTIMPLEMENTED;
    return THPVariable_Wrap(paged_forward(args, id, config, args[8]));
  } catch (const fa::Error& error) {
    fa::python::set_python_error(error);
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

PyMethodDef paged_forward_method = {
    "paged_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&paged_forward_call)),
    METH_FASTCALL,
    "paged_forward(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, seq_len_q, config_id, scale, "
    "descale_k, descale_v) -> O of a call over paged caches with a dense q (seq_len_q None: every sequence's "
    "rows of q; scale None: 1/sqrt(d); descales None but for FP8 caches) on the current stream; or "
    "NotImplemented for a call it leaves to the general path."};

}  // namespace

PYBIND11_MODULE(_torch_ops, m) {
  m.doc() = "fusedattn.torch's eager calls in C++ (inference and training; paged inference).";
  m.add_object("forward", py::reinterpret_steal<py::object>(PyCFunction_New(&forward_method, nullptr)));
  m.add_object("ragged_forward", py::reinterpret_steal<py::object>(PyCFunction_New(&ragged_forward_method, nullptr)));
  m.add_object("forward_stats", py::reinterpret_steal<py::object>(PyCFunction_New(&forward_stats_method, nullptr)));
  m.add_object("backward", py::reinterpret_steal<py::object>(PyCFunction_New(&backward_method, nullptr)));
  m.add_object("prefix_forward", py::reinterpret_steal<py::object>(PyCFunction_New(&prefix_forward_method, nullptr)));
  m.add_object("prefix_backward",
               py::reinterpret_steal<py::object>(PyCFunction_New(&prefix_backward_method, nullptr)));
  m.add_object("paged_forward", py::reinterpret_steal<py::object>(PyCFunction_New(&paged_forward_method, nullptr)));
}
