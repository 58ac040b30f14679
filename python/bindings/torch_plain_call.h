// fusedattn._torch_ops's plain dense call (no bias, sink, dropout, lengths or extra outputs; a score
// modifier of scalars only) in pieces that its entry points share: the arguments taken, the spec,
// the forward enqueued (torch_ops.cpp's forward and forward_stats, torch_prefix.h's prefix-LM). A
// header of the module's one translation unit, as torch_workspace.h is.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/call.h"
#include "fusedattn/errors.h"
#include "fusedattn/spec.h"
#include "torch_tensors.h"
#include "torch_workspace.h"

namespace fusedattn_torch {

namespace fa = fusedattn;

// The spec of a call on q, k, v (dense, or packed `sequences`): the core builds and validates it,
// once (get_plan takes the ValidatedSpec as it is). It writes the statistics only when training: the
// backward reads them.
inline fa::ValidatedSpec spec_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const fa::CallConfig& config, bool training, const Sequences& sequences = {}) {
  fa::CallShape shape;
  shape.q = view_of(q);
  shape.k = view_of(k);
  shape.v = view_of(v);
  shape.sequences = sequences.count;
  shape.max_seq_q = sequences.max_q;
  shape.max_seq_kv = sequences.max_kv;
  if (config.options.stats == training) return fa::make_spec(config, shape);
  fa::CallConfig with_stats = config;
  with_stats.options.stats = training;
  return fa::make_spec(with_stats, shape);
}

// Whether a config asks for no tensor but q, k and v (and a score modifier's scalars, and for packed
// sequences their offsets): no bias, sink, dropout, lengths, max logit or pages.
inline bool plain_options(const fa::CallConfig& config) {
  const fa::AttentionOptions& o = config.options;
  return config.kv_layout == config.layout && o.bias == fa::Bias::none && o.softmax != fa::Softmax::sink &&
         o.dropout == 0.0 && !o.padding && o.max_logit == fa::MaxLogit::none && o.kv_pages == 0 &&
         o.score_mod.tensors() == 0;
}

// Whether forward() takes calls of this config: dense, with plain options.
inline bool plain(const fa::CallConfig& config) { return config.layout != fa::AxisOrder::thd && plain_options(config); }

// The score modifier's scalars (args[5] where given: None or a float32 tensor on q's device with
// at least as many values as the config's modifier reads), or an undefined tensor where it reads
// none; throws where it reads some and none came.
inline at::Tensor mod_scalars_argument(PyObject* const* args, Py_ssize_t count, const fa::CallConfig& config,
                                       const at::Tensor& q) {
  const int wanted = config.options.score_mod.scalars();
  PyObject* given = count > 5 ? args[5] : Py_None;
  if (wanted == 0) return at::Tensor();
  if (given == Py_None) {
    throw fa::InvalidArgument("mod_scalars", "None", "the score modifier's " + std::to_string(wanted) + " scalars");
  }
  const at::Tensor& scalars = tensor_argument(given, "mod_scalars");
  if (scalars.scalar_type() != at::kFloat || !scalars.is_contiguous() || scalars.numel() < wanted ||
      scalars.device() != q.device()) {
    throw fa::InvalidArgument("mod_scalars", scalars.toString(),
                              "float32, contiguous, on q's device, with " + std::to_string(wanted) + " values");
  }
  return scalars;
}

// A plain call's forward enqueued: its spec, scale, O and (with `stats`) the statistics. O and the
// statistics take their sizes from the core's table (for packed sequences, q's tokens).
struct ForwardRun {
  fa::ValidatedSpec valid;
  float scale;
  at::Tensor o, stats;
};

inline ForwardRun run_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& mod_scalars, int config_id, const fa::CallConfig& config,
                              PyObject* scale_object, bool stats, const Sequences& sequences = {}) {
  ForwardRun run{spec_of(q, k, v, config, stats, sequences), 0.0f, {}, {}};
  run.scale = scale_value(scale_object, run.valid.spec());
  const c10::cuda::CUDAGuard device(q.device());
  // A plain config's forward writes O, and the statistics when asked (float32, the core's order).
  const std::vector<fa::OutputAxes>& outputs = forward_outputs(config_id, config, stats);
  const std::array<const at::Tensor*, 3> inputs = {&q, &k, &v};
  run.o = allocate(outputs[0], inputs, q.scalar_type());
  fa::ForwardTensors t;
  t.q = q.data_ptr();
  t.k = k.data_ptr();
  t.v = v.data_ptr();
  t.o = run.o.data_ptr();
  t.ragged = sequences.tensors();
  if (mod_scalars.defined()) t.score_mod.scalars = mod_scalars.data_ptr<float>();
  if (stats) {
    run.stats = allocate(outputs.at(1), inputs, at::kFloat);
    t.stats = run.stats.data_ptr<float>();
  }
  enqueue(*fa::get_plan(run.valid, fa::Pass::forward), t, run.scale, q.get_device());
  return run;
}

// q, k, v, the config and the score modifier's scalars of forward(q, k, v, config_id, scale[,
// mod_scalars]) and forward_stats(), or nothing for a call left to the general path.
struct PlainArguments {
  at::Tensor q, k, v;
  int id;
  const fa::CallConfig* config;
  at::Tensor mod_scalars;
};

inline std::optional<PlainArguments> plain_arguments(PyObject* const* args, Py_ssize_t count) {
  const at::Tensor& q = tensor_argument(args[0], "q");
  const at::Tensor& k = tensor_argument(args[1], "k");
  const at::Tensor& v = tensor_argument(args[2], "v");
  const int id = config_id_argument(args[3]);
  const fa::CallConfig& config = fa::registered_config(id);
  if (!plain(config) || !attention_inputs_run_here(args)) return std::nullopt;
  return PlainArguments{q, k, v, id, &config, mod_scalars_argument(args, count, config, q)};
}

// A new Python tuple of the tensors (each wrapped once: the tuple owns the references).
inline PyObject* tuple_of(const std::vector<at::Tensor>& tensors) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(tensors.size()));
  if (tuple == nullptr) return nullptr;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), THPVariable_Wrap(tensors[i]));
  }
  return tuple;
}

}  // namespace fusedattn_torch
