// fusedattn._torch_ops's paged call (torch_ops.cpp): fusedattn.torch.paged_attention's eager calls in
// C++, where a decode step's attention at batch 1 takes less GPU time than Python takes host time.
// A header of the module's one translation unit, as torch_workspace.h is.
//
// paged_forward(q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, seq_len_q, config_id,
// scale, descale_k, descale_v) -> O runs a call over paged caches with a dense q (bshd, sbhd),
// seq_len_q None or given, and caches in q's dtype (descales None) or in E4M3 (an FP8 cache, with its
// float32 descales), or returns NotImplemented for a call it leaves to the general path: one that
// needs PyTorch's machinery (as forward's), or whose tables, lengths and descales are not what the
// core reads by address (int32 tables [b, pages] and lengths [b], float32 descales of one element or
// [h_kv], contiguous, on q's device), which the general path refuses in words shared with
// fusedattn.jax (or makes contiguous). So the errors either path raises are the same: the core's,
// from make_spec and Plan::run, or the general path's own.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstdint>

#include "fusedattn/attention.h"
#include "fusedattn/call.h"
#include "fusedattn/spec.h"
#include "torch_tensors.h"
#include "torch_workspace.h"

namespace fusedattn_torch {

namespace fa = fusedattn;

// Whether paged_forward takes calls of this config: paged caches beside a dense q, with runtime
// lengths and no tensor but q, the pools, the tables and the lengths (an inference call: no
// statistics).
inline bool paged(const fa::CallConfig& config) {
  const fa::AttentionOptions& o = config.options;
  return o.kv_pages > 0 && o.padding && !o.stats && config.layout != fa::AxisOrder::thd &&
         config.kv_layout != fa::AxisOrder::thd && o.bias == fa::Bias::none && o.softmax != fa::Softmax::sink &&
         o.dropout == 0.0 && !o.dropout_mask_out && o.max_logit == fa::MaxLogit::none && o.score_mod.empty();
}

// Whether `object` is an array the core reads by address as int32 `sizes` on `device`: plain,
// int32 and contiguous.
inline bool int32_array(PyObject* object, const c10::Device& device, at::IntArrayRef sizes) {
  if (!plain_cuda_tensor(object)) return false;
  const at::Tensor& t = THPVariable_Unpack(object);
  return t.scalar_type() == at::kInt && t.device() == device && t.sizes() == sizes && t.is_contiguous();
}

// Whether `object` is a descale the core reads by address: a plain float32 tensor of `count`
// elements, contiguous, on `device`.
inline bool float32_array(PyObject* object, const c10::Device& device, std::int64_t count) {
  if (!plain_cuda_tensor(object)) return false;
  const at::Tensor& t = THPVariable_Unpack(object);
  return t.scalar_type() == at::kFloat && t.device() == device && t.numel() == count && t.dim() <= 1 &&
         t.is_contiguous();
}

// Whether q and the pools are ones paged_forward takes: as forward takes them (one half type), or q
// f16 or bf16 beside E4M3 pools with their descales (args[9], args[10]), one element each or one a
// K/V head as the config's fp8_scaling says.
inline bool pools_run_here(PyObject* const* args, const fa::CallConfig& config) {
  if (args[9] == Py_None && args[10] == Py_None) return attention_inputs_run_here(args);
  if (c10::impl::TorchDispatchModeTLS::any_modes_set()) return false;
  for (int i = 0; i < 3; ++i) {
    if (!plain_cuda_tensor(args[i]) || THPVariable_Unpack(args[i]).dim() != 4) return false;
  }
  const at::Tensor& q = THPVariable_Unpack(args[0]);
  const at::Tensor& k = THPVariable_Unpack(args[1]);
  const at::Tensor& v = THPVariable_Unpack(args[2]);
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  const bool fp8 = k.scalar_type() == at::kFloat8_e4m3fn && v.scalar_type() == at::kFloat8_e4m3fn;
  if (!half || !fp8 || k.device() != q.device() || v.device() != q.device()) return false;
  const std::int64_t count =
      config.options.fp8_scaling == fa::Fp8Scaling::head ? k.size(fa::axes_of(config.kv_layout)[1]) : 1;
  return float32_array(args[9], q.device(), count) && float32_array(args[10], q.device(), count);
}

// Whether a call is one paged_forward runs itself: q and the pools as pools_run_here takes them, and
// the tables [b, kv_pages] and lengths [b] as the core reads them, b being q's batch in the config's
// layout. args: q, k_cache, v_cache, page_table_k, page_table_v, seq_len_kv, seq_len_q (or None),
// config_id, scale, descale_k, descale_v (or None).
inline bool paged_runs_here(PyObject* const* args, const fa::CallConfig& config) {
  if (!pools_run_here(args, config)) return false;
  const at::Tensor& q = THPVariable_Unpack(args[0]);
  const std::array<std::int64_t, 2> table = {q.size(fa::axes_of(config.layout)[0]), config.options.kv_pages};
  const at::IntArrayRef batch(table.data(), 1);
  return int32_array(args[3], q.device(), table) && int32_array(args[4], q.device(), table) &&
         int32_array(args[5], q.device(), batch) && (args[6] == Py_None || int32_array(args[6], q.device(), batch));
}

inline const std::int32_t* int32_data(PyObject* object) {
  return object == Py_None ? nullptr : THPVariable_Unpack(object).data_ptr<std::int32_t>();
}

// The call itself (paged_runs_here said yes): the spec from q and the pools (the core validates it;
// its plan cache finds the plan), O from PyTorch's caching allocator in the sizes of the core's
// table, and the plan enqueued on the current stream with the tables, lengths and descales where
// they are.
// Without seq_len_q every sequence has all of q's rows: no array to fill each step.
inline at::Tensor paged_forward(PyObject* const* args, int config_id, const fa::CallConfig& config,
                                PyObject* scale_object) {
  const at::Tensor& q = THPVariable_Unpack(args[0]);
  const at::Tensor& k = THPVariable_Unpack(args[1]);
  const at::Tensor& v = THPVariable_Unpack(args[2]);
  fa::CallShape shape;
  shape.q = view_of(q);
  shape.k = view_of(k);
  shape.v = view_of(v);
  const fa::ValidatedSpec valid = fa::make_spec(config, shape);
  const float scale = scale_value(scale_object, valid.spec());
  const c10::cuda::CUDAGuard device(q.device());
  at::Tensor o = allocate(forward_outputs(config_id, config, /*training=*/false).at(0), {&q, &k, &v},
                          q.scalar_type());
  fa::ForwardTensors t;
  t.q = q.data_ptr();
  t.k = k.data_ptr();
  t.v = v.data_ptr();
  t.o = o.data_ptr();
  t.page_table_k = int32_data(args[3]);
  t.page_table_v = int32_data(args[4]);
  t.seq_len_kv = int32_data(args[5]);
  t.seq_len_q = int32_data(args[6]);
  if (args[9] != Py_None) {  // an FP8 cache (pools_run_here: both descales)
    t.fp8.descale_k = THPVariable_Unpack(args[9]).data_ptr<float>();
    t.fp8.descale_v = THPVariable_Unpack(args[10]).data_ptr<float>();
  }
  enqueue(*fa::get_plan(valid, fa::Pass::forward), t, scale, q.get_device());
  return o;
}

}  // namespace fusedattn_torch
