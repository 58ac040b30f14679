// testing/check_outputs.cpp — fusedattn's outputs and the references', each gathered to the host.
#include "testing/check_outputs.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "fusedattn/reference.h"
#include "testing/cuda_check.h"
#include "testing/twins.h"

namespace fusedattn::check {
namespace {

// The per-head max logit from row maxima [b, h, s_q]: padded rows are -inf there, so a plain
// max over the batch and rows leaves them out.
template <class T>
std::vector<T> max_per_head(const std::vector<T>& rows, const AttentionSpec& spec) {
  std::vector<T> out(static_cast<std::size_t>(spec.heads_q()), -std::numeric_limits<T>::infinity());
  for (std::int64_t b = 0; b < spec.batch(); ++b) {
    for (std::int64_t h = 0; h < spec.heads_q(); ++h) {
      for (std::int64_t i = 0; i < spec.seq_q(); ++i) {
        const T value = rows[static_cast<std::size_t>((b * spec.heads_q() + h) * spec.seq_q() + i)];
        out[static_cast<std::size_t>(h)] = std::max(out[static_cast<std::size_t>(h)], value);
      }
    }
  }
  return out;
}

std::vector<float> download_floats(const float* device, std::int64_t n, const char* what) {
  std::vector<float> host(static_cast<std::size_t>(n));
  check_cuda(cudaMemcpy(host.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost), what);
  return host;
}

// A fusedattn output tensor as contiguous float32: exact for 16-bit values, and NaN stays NaN.
std::vector<float> gather_output(const TensorDesc& desc, const void* device) {
  DeviceBuffer contiguous(static_cast<std::size_t>(desc.elements()) * sizeof(float));
  gather_to_float_gpu(desc, device, contiguous.as<float>(), nullptr);
  check_cuda(cudaGetLastError(), "gather_to_float_gpu");
  return download_floats(contiguous.as<float>(), desc.elements(), "cudaMemcpy(gathered output, device to host)");
}

}  // namespace

Outputs<float> run_fusedattn(const CheckProblem& p, AttentionBuffers& buffers) {
  const float scale = static_cast<float>(p.scale);
  const bool ragged = p.run_spec.ragged_q() || p.run_spec.ragged_kv();
  std::unique_ptr<RaggedTwinCall> ragged_call(ragged ? new RaggedTwinCall(p.spec, buffers) : nullptr);
  std::unique_ptr<PagedTwinCall> paged_call(
      p.run_spec.paged_kv() ? new PagedTwinCall(p.run_spec, p.spec, buffers.forward_tensors(), p.options.seed) : nullptr);
  {
    DeviceBuffer workspace(get_plan(p.run_spec, Pass::forward)->workspace_bytes());
    ForwardTensors tensors = buffers.forward_tensors();
    if (ragged) tensors.ragged = ragged_call->tensors;
    if (paged_call) {
      tensors.k = paged_call->k_pool.get();
      tensors.v = paged_call->v_pool.get();
      tensors.page_table_k = paged_call->table_k.as<std::int32_t>();
      tensors.page_table_v = paged_call->table_v.as<std::int32_t>();
    }
    if (p.options.forward_without_seq_len_q) tensors.seq_len_q = nullptr;
    forward(p.run_spec, tensors, scale, nullptr, Workspace{workspace.get(), workspace.bytes()});
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after fusedattn forward)");
  }
  if (p.options.backward) {
    DeviceBuffer workspace(get_plan(p.run_spec, Pass::backward)->workspace_bytes());
    BackwardTensors tensors = buffers.backward_tensors();
    if (ragged) tensors.ragged = ragged_call->tensors;
    backward(p.run_spec, tensors, scale, nullptr, Workspace{workspace.get(), workspace.bytes()});
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after fusedattn backward)");
  }
  Outputs<float> out;
  const ForwardTensors f = buffers.forward_tensors();
  out.o = gather_output(p.spec.o, f.o);
  if (p.spec.stats) out.lse = download_floats(f.stats, stats_elements(p.spec), "cudaMemcpy(stats, device to host)");
  if (p.spec.stats && p.run_spec.ragged_q()) out.lse = statistics_by_head(out.lse, p.spec);
  if (p.spec.max_logit != MaxLogit::none) {
    out.max_logit = download_floats(f.max_logit, static_cast<std::int64_t>(max_logit_elements(p.spec)),
                                    "cudaMemcpy(max logit, device to host)");
  }
  if (p.spec.dropout_mask_out) {
    out.dropout_mask = download_floats(f.dropout_mask, static_cast<std::int64_t>(mask_elements(p.spec)),
                                       "cudaMemcpy(dropout mask, device to host)");
  }
  if (p.options.backward) {
    const BackwardTensors b = buffers.backward_tensors();
    out.dq = gather_output(p.spec.q, b.d_q);
    out.dk = gather_output(p.spec.k, b.d_k);
    out.dv = gather_output(p.spec.v, b.d_v);
    if (p.spec.bias_grad) out.dbias = gather_output(bias_desc(p.spec), b.d_bias);
    if (p.spec.softmax == Softmax::sink) out.dsink = download_floats(b.d_sink, p.spec.heads_q(), "cudaMemcpy(dSink)");
  }
  return out;
}

Outputs<double> reference_cpu(const CheckProblem& p, const AttentionBuffers& buffers, const std::vector<float>& mask) {
  const auto q = gather_to_double(p.spec.q, buffers.host_input("q"));
  const auto k = gather_to_double(p.spec.k, buffers.host_input("k"));
  const auto v = gather_to_double(p.spec.v, buffers.host_input("v"));
  Outputs<double> ref;
  ref.o.resize(static_cast<std::size_t>(p.spec.o.elements()));
  ref.lse.resize(static_cast<std::size_t>(stats_elements(p.spec)));
  std::vector<double> bias, sink(buffers.sink().begin(), buffers.sink().end());
  if (p.spec.bias != Bias::none) bias = gather_to_double(bias_desc(p.spec), buffers.host_input("bias"));
  ReferenceExtras<double> extras;
  extras.bias = bias.empty() ? nullptr : bias.data();
  extras.sink = sink.empty() ? nullptr : sink.data();
  const std::vector<double> keep(mask.begin(), mask.end());
  extras.dropout_mask = keep.empty() ? nullptr : keep.data();
  if (p.spec.max_logit != MaxLogit::none) {
    ref.max_logit.resize(static_cast<std::size_t>(stats_elements(p.spec)));
    extras.max_logit = ref.max_logit.data();
  }
  reference_forward_cpu(p.ref, q.data(), k.data(), v.data(), ref.o.data(), ref.lse.data(), extras);
  if (p.spec.max_logit == MaxLogit::head) ref.max_logit = max_per_head(ref.max_logit, p.spec);
  if (p.options.backward) {
    const auto d_o = gather_to_double(p.spec.o, buffers.host_input("do"));
    ref.dq.resize(q.size());
    ref.dk.resize(k.size());
    ref.dv.resize(v.size());
    ReferenceExtras<double> grads;
    grads.bias = extras.bias;
    grads.sink = extras.sink;
    grads.dropout_mask = extras.dropout_mask;
    if (p.spec.bias_grad) {
      ref.dbias.resize(bias.size());
      grads.d_bias = ref.dbias.data();
    }
    if (p.spec.softmax == Softmax::sink) {
      ref.dsink.resize(sink.size());
      grads.d_sink = ref.dsink.data();
    }
    reference_backward_cpu(p.ref, q.data(), k.data(), v.data(), d_o.data(), ref.dq.data(), ref.dk.data(),
                           ref.dv.data(), grads);
  }
  return ref;
}

Outputs<float> reference_gpu(const CheckProblem& p, const AttentionBuffers& buffers) {
  // With dropout the keep mask fusedattn drew is still on the device, where the reference reads it.
  const AttentionSpec& spec = p.spec;
  auto floats = [](const TensorDesc& desc) {
    return DeviceBuffer(static_cast<std::size_t>(desc.elements()) * sizeof(float));
  };
  const ForwardTensors in = buffers.forward_tensors();
  DeviceBuffer q = floats(spec.q), k = floats(spec.k), v = floats(spec.v), o = floats(spec.o);
  DeviceBuffer lse(static_cast<std::size_t>(stats_elements(spec)) * sizeof(float));
  gather_to_float_gpu(spec.q, in.q, q.as<float>(), nullptr);
  gather_to_float_gpu(spec.k, in.k, k.as<float>(), nullptr);
  gather_to_float_gpu(spec.v, in.v, v.as<float>(), nullptr);
  ReferenceExtras<float> extras;
  DeviceBuffer bias, max_logit;
  if (spec.bias != Bias::none) {
    bias = floats(bias_desc(spec));
    gather_to_float_gpu(bias_desc(spec), in.bias, bias.as<float>(), nullptr);
    extras.bias = bias.as<float>();
  }
  extras.sink = in.sink;  // already float32 on the device
  extras.dropout_mask = in.dropout_mask;
  if (spec.max_logit != MaxLogit::none) {
    max_logit = DeviceBuffer(static_cast<std::size_t>(stats_elements(spec)) * sizeof(float));
    extras.max_logit = max_logit.as<float>();
  }
  reference_forward_gpu(p.ref, q.as<float>(), k.as<float>(), v.as<float>(), o.as<float>(), lse.as<float>(), nullptr,
                        extras);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after reference_forward_gpu)");
  Outputs<float> ref;
  ref.o = download_floats(o.as<float>(), spec.o.elements(), "cudaMemcpy(reference O)");
  ref.lse = download_floats(lse.as<float>(), stats_elements(spec), "cudaMemcpy(reference lse)");
  if (spec.max_logit != MaxLogit::none) {
    ref.max_logit = download_floats(max_logit.as<float>(), stats_elements(spec), "cudaMemcpy(reference max logit)");
    if (spec.max_logit == MaxLogit::head) ref.max_logit = max_per_head(ref.max_logit, spec);
  }
  if (p.options.backward) {
    DeviceBuffer d_o = floats(spec.o), dq = floats(spec.q), dk = floats(spec.k), dv = floats(spec.v);
    gather_to_float_gpu(spec.o, buffers.backward_tensors().d_o, d_o.as<float>(), nullptr);
    ReferenceExtras<float> grads;
    grads.bias = extras.bias;
    grads.sink = extras.sink;
    grads.dropout_mask = extras.dropout_mask;
    DeviceBuffer d_bias, d_sink;
    if (spec.bias_grad) {
      d_bias = floats(bias_desc(spec));
      grads.d_bias = d_bias.as<float>();
    }
    if (spec.softmax == Softmax::sink) {
      d_sink = DeviceBuffer(static_cast<std::size_t>(spec.heads_q()) * sizeof(float));
      grads.d_sink = d_sink.as<float>();
    }
    reference_backward_gpu(p.ref, q.as<float>(), k.as<float>(), v.as<float>(), o.as<float>(), lse.as<float>(),
                           d_o.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>(), nullptr, grads);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after reference_backward_gpu)");
    if (spec.bias_grad) ref.dbias = download_floats(d_bias.as<float>(), bias_desc(spec).elements(), "cudaMemcpy(dBias)");
    if (spec.softmax == Softmax::sink) ref.dsink = download_floats(d_sink.as<float>(), spec.heads_q(), "cudaMemcpy(dSink)");
    ref.dq = download_floats(dq.as<float>(), spec.q.elements(), "cudaMemcpy(reference dQ)");
    ref.dk = download_floats(dk.as<float>(), spec.k.elements(), "cudaMemcpy(reference dK)");
    ref.dv = download_floats(dv.as<float>(), spec.v.elements(), "cudaMemcpy(reference dV)");
  }
  return ref;
}

}  // namespace fusedattn::check
