// testing/fp8_check.cpp — Fp8Problem and check_fp8_against_reference (see fp8_check.h).
#include "testing/fp8_check.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"
#include "fusedattn/reference.h"
#include "testing/attention_buffers.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"

namespace fusedattn::check {
namespace {

// The tensors that carry a scale, a descale and an amax, each in three consecutive floats of one
// device buffer: X8 = fp8(X * scale), X = X8 * descale.
enum Scaled : int { kQ, kK, kV, kS, kO, kDO, kDP, kDQ, kDK, kDV, kScaledCount };
enum Part : int { kScale, kDescale, kAmax };

std::size_t bytes_of(const TensorDesc& desc) { return static_cast<std::size_t>(desc.extent()) * size_of(desc.dtype); }

AttentionSpec in_bf16(AttentionSpec spec) {
  for (TensorDesc* t : {&spec.q, &spec.k, &spec.v, &spec.o}) t->dtype = DType::bf16;
  spec.stats = true;  // the BF16 comparison's backward reads them
  spec.fp8_gradients = Fp8Gradients::as_inputs;
  return spec;
}

// n floats from the device, each times `factor` (a descale, or the chain rule's factors).
std::vector<float> to_host(const float* device, std::int64_t n, double factor = 1.0) {
  std::vector<float> out(static_cast<std::size_t>(n));
  check_cuda(cudaMemcpy(out.data(), device, out.size() * sizeof(float), cudaMemcpyDeviceToHost),
             "cudaMemcpy(device to host)");
  for (float& x : out) x = static_cast<float>(x * factor);
  return out;
}

// A tensor of any layout and dtype as contiguous float32 [b, h, s, d] on the host, times `factor`.
std::vector<float> decoded(const TensorDesc& desc, const void* data, double factor) {
  DeviceBuffer dense(static_cast<std::size_t>(desc.elements()) * sizeof(float));
  gather_to_float_gpu(desc, data, dense.as<float>(), nullptr);
  return to_host(dense.as<float>(), desc.elements(), factor);
}

double error_of(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  return relative_error<float, float>(out.data(), ref.data(), static_cast<std::int64_t>(out.size()));
}

int mantissa_bits(DType dtype) { return dtype == DType::e4m3 ? 3 : 2; }

double max_abs(const std::vector<float>& x) {
  double largest = 0.0;
  for (float v : x) largest = std::max(largest, static_cast<double>(std::fabs(v)));
  return largest;
}

}  // namespace

struct Fp8Problem::State {
  AttentionSpec spec, twin;
  bool with_backward = false;
  std::unique_ptr<AttentionBuffers> originals;  // BF16, the twin's layout
  DeviceBuffer q, k, v, o, d_o, d_q, d_k, d_v;  // FP8, the spec's descriptors
  DeviceBuffer stats;
  DeviceBuffer scalars;  // kScaledCount triples of float
  DeviceBuffer workspace_memory;  // enough for every plan this problem runs (FP8 and BF16, both passes)
  Workspace workspace;

  float* at(Scaled t, Part part) const { return scalars.as<float>() + 3 * t + part; }
  const float* scale(Scaled t) const { return at(t, kScale); }
  const float* descale(Scaled t) const { return at(t, kDescale); }
  float* amax(Scaled t) const { return at(t, kAmax); }

  // Current scaling of one BF16 original into its FP8 copy.
  void quantize(Scaled t, const TensorDesc& from_desc, const void* from, const TensorDesc& to_desc, void* to) const {
    measure_amax(from_desc, from, amax(t), nullptr);
    rescale_from_amax({t}, to_desc.dtype);
    quantize_fp8(from_desc, from, to_desc, to, scale(t), nullptr, nullptr);
  }

  void unit_scales(std::initializer_list<Scaled> which) const {
    const float ones[2] = {1.0f, 1.0f};
    for (Scaled t : which) {
      check_cuda(cudaMemcpy(at(t, kScale), ones, sizeof ones, cudaMemcpyHostToDevice), "cudaMemcpy(unit scales)");
    }
  }

  void rescale_from_amax(std::initializer_list<Scaled> which, DType dtype) const {
    for (Scaled t : which) scale_from_amax(amax(t), dtype, 0, at(t, kScale), at(t, kDescale), nullptr);
  }

  // The probabilities' scale: fixed at the format's largest value (see fp8_scales.h).
  void fixed_scale_s() const {
    const float max = fp8_max(spec.q.dtype), pair[2] = {max, 1.0f / max};
    check_cuda(cudaMemcpy(at(kS, kScale), pair, sizeof pair, cudaMemcpyHostToDevice), "cudaMemcpy(scale_s)");
  }

  float host(Scaled t, Part part) const {
    float value = 0.0f;
    check_cuda(cudaMemcpy(&value, at(t, part), sizeof value, cudaMemcpyDeviceToHost), "cudaMemcpy(scalar)");
    return value;
  }
};

Fp8Problem::Fp8Problem(const AttentionSpec& spec, bool with_backward, std::uint64_t seed) : state_(new State) {
  State& s = *state_;
  validate(spec);
  if (!is_fp8(spec.q.dtype) || spec.ragged_q() || spec.ragged_kv() || spec.paged_kv()) {
    throw InvalidArgument("spec", to_string(spec), "an FP8 spec with dense tensors (Fp8Problem)");
  }
  s.spec = spec;
  s.spec.stats = spec.stats || with_backward;
  s.twin = in_bf16(spec);
  s.with_backward = with_backward;
  s.originals = std::make_unique<AttentionBuffers>(s.twin, with_backward);
  s.originals->fill_inputs(seed);
  s.q = DeviceBuffer(bytes_of(spec.q));
  s.k = DeviceBuffer(bytes_of(spec.k));
  s.v = DeviceBuffer(bytes_of(spec.v));
  s.o = DeviceBuffer(bytes_of(spec.o));
  s.stats = DeviceBuffer(static_cast<std::size_t>(stats_elements(spec)) * sizeof(float));
  if (with_backward) {
    s.d_o = DeviceBuffer(bytes_of(spec.o));
    s.d_q = DeviceBuffer(bytes_of(spec.q));
    s.d_k = DeviceBuffer(bytes_of(spec.k));
    s.d_v = DeviceBuffer(bytes_of(spec.v));
  }
  s.scalars = DeviceBuffer(3 * kScaledCount * sizeof(float));
  check_cuda(cudaMemset(s.scalars.get(), 0, s.scalars.bytes()), "cudaMemset(scalars)");
  const ForwardTensors in = s.originals->forward_tensors();
  s.quantize(kQ, s.twin.q, in.q, spec.q, s.q.get());
  s.quantize(kK, s.twin.k, in.k, spec.k, s.k.get());
  s.quantize(kV, s.twin.v, in.v, spec.v, s.v.get());
  if (with_backward) {
    s.quantize(kDO, s.twin.o, s.originals->backward_tensors().d_o, gradient_desc(spec.o, spec), s.d_o.get());
  }
  std::size_t bytes = 0;
  for (const AttentionSpec* plan_spec : {&s.spec, &s.twin}) {
    bytes = std::max(bytes, get_plan(*plan_spec, Pass::forward)->workspace_bytes());
    if (with_backward) bytes = std::max(bytes, get_plan(*plan_spec, Pass::backward)->workspace_bytes());
  }
  s.workspace_memory = DeviceBuffer(bytes);
  s.workspace = Workspace{s.workspace_memory.get(), bytes};
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(quantize)");
}

const Workspace& Fp8Problem::workspace() const noexcept { return state_->workspace; }

Fp8Problem::~Fp8Problem() = default;

const AttentionSpec& Fp8Problem::spec() const noexcept { return state_->spec; }
const AttentionSpec& Fp8Problem::bf16_spec() const noexcept { return state_->twin; }

ForwardTensors Fp8Problem::forward_tensors() const {
  const State& s = *state_;
  ForwardTensors t;
  t.q = s.q.get();
  t.k = s.k.get();
  t.v = s.v.get();
  t.o = s.o.get();
  t.stats = s.stats.as<float>();
  t.fp8 = {s.descale(kQ), s.descale(kK), s.descale(kV), s.descale(kS), s.scale(kS), s.scale(kO), s.amax(kS), s.amax(kO)};
  const ForwardTensors originals = s.originals->forward_tensors();  // the lengths (spec.padding), shared
  t.seq_len_q = originals.seq_len_q;
  t.seq_len_kv = originals.seq_len_kv;
  return t;
}

BackwardTensors Fp8Problem::backward_tensors() const {
  const State& s = *state_;
  if (!s.with_backward) throw InvalidArgument("with_backward", "false", "an Fp8Problem made with_backward");
  BackwardTensors t;
  t.q = s.q.get();
  t.k = s.k.get();
  t.v = s.v.get();
  t.o = s.o.get();
  t.d_o = s.d_o.get();
  t.stats = s.stats.as<float>();
  t.d_q = s.d_q.get();
  t.d_k = s.d_k.get();
  t.d_v = s.d_v.get();
  const BackwardTensors originals = s.originals->backward_tensors();
  t.seq_len_q = originals.seq_len_q;
  t.seq_len_kv = originals.seq_len_kv;
  Fp8BackwardScales& f = t.fp8;
  f.descale_q = s.descale(kQ);
  f.descale_k = s.descale(kK);
  f.descale_v = s.descale(kV);
  f.descale_o = s.descale(kO);
  f.descale_d_o = s.descale(kDO);
  f.descale_s = s.descale(kS);
  f.descale_d_p = s.descale(kDP);
  f.scale_s = s.scale(kS);
  f.scale_d_p = s.scale(kDP);
  f.scale_d_q = s.scale(kDQ);
  f.scale_d_k = s.scale(kDK);
  f.scale_d_v = s.scale(kDV);
  f.amax_d_q = s.amax(kDQ);
  f.amax_d_k = s.amax(kDK);
  f.amax_d_v = s.amax(kDV);
  f.amax_d_p = s.amax(kDP);
  return t;
}

ForwardTensors Fp8Problem::bf16_forward_tensors() const { return state_->originals->forward_tensors(); }
BackwardTensors Fp8Problem::bf16_backward_tensors() const { return state_->originals->backward_tensors(); }

void Fp8Problem::run_forward(float scale) {
  const State& s = *state_;
  s.unit_scales({kO});
  s.fixed_scale_s();
  for (int call = 0; call < 2; ++call) {  // calibration, then the measured call
    check_cuda(cudaMemset(s.o.get(), 0xFF, s.o.bytes()), "cudaMemset(poison O)");
    forward(s.spec, forward_tensors(), scale, nullptr, s.workspace);
    if (call == 0) s.rescale_from_amax({kO}, s.spec.o.dtype);
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(FP8 forward)");
}

void Fp8Problem::run_backward(float scale) {
  const State& s = *state_;
  s.unit_scales({kDP, kDQ, kDK, kDV});
  for (int call = 0; call < 2; ++call) {
    for (const DeviceBuffer* grad : {&s.d_q, &s.d_k, &s.d_v}) {
      check_cuda(cudaMemset(grad->get(), 0xFF, grad->bytes()), "cudaMemset(poison gradients)");
    }
    backward(s.spec, backward_tensors(), scale, nullptr, s.workspace);
    if (call == 0) s.rescale_from_amax({kDP, kDQ, kDK, kDV}, gradient_dtype(s.spec));  // dP in dO's format
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(FP8 backward)");
}

std::string Fp8CheckResult::to_string() const {
  char text[800];
  int length = std::snprintf(
      text, sizeof text,
      "%s | seed %llu | vs f32 of dequantized inputs: O %.2e dQ %.2e dK %.2e dV %.2e (tolerance %.3g / %.3g) | "
      "vs BF16: O %.2e dQ %.2e dK %.2e dV %.2e | amax_o %.6g (reference %.6g) amax_s %.6g",
      spec.c_str(), static_cast<unsigned long long>(seed), err_o, err_dq, err_dk, err_dv, tolerance_forward,
      tolerance_backward, bf16_o, bf16_dq, bf16_dk, bf16_dv, amax_o, reference_amax_o, amax_s);
  if (backward && length > 0 && static_cast<std::size_t>(length) < sizeof text) {
    length += std::snprintf(text + length, sizeof text - static_cast<std::size_t>(length),
                            " amax_dq %.6g (%.6g) amax_dk %.6g (%.6g) amax_dv %.6g (%.6g)", amax_dq,
                            reference_amax_dq, amax_dk, reference_amax_dk, amax_dv, reference_amax_dv);
  }
  return std::string(text) + (passed ? " | PASS" : " | FAIL");
}

Fp8CheckResult check_fp8_against_reference(const AttentionSpec& spec, bool backward, std::uint64_t seed) {
  if (seed == 0) seed = std::random_device{}();
  Fp8Problem problem(spec, backward, seed);
  const Fp8Problem::State& s = problem.state();
  const float scale = default_scale(spec);
  problem.run_forward(scale);
  if (backward) problem.run_backward(scale);

  Fp8CheckResult result;
  result.spec = to_string(spec);
  result.seed = seed;
  result.backward = backward;
  result.tolerance_forward = std::ldexp(1.0, -(mantissa_bits(spec.q.dtype) + 1));
  result.tolerance_backward = std::ldexp(2.0, -(mantissa_bits(gradient_dtype(spec)) + 1));

  // The reference runs on the FP8 values as stored, with the descales folded in exactly: the
  // scores' scale takes descale_q * descale_k, O takes descale_v, and the gradients the factors of
  // the chain rule (L = sum(O * dO) with dO = dO8 * descale_dO).
  const double dq = s.host(kQ, kDescale), dk = s.host(kK, kDescale), dv = s.host(kV, kDescale);
  ReferenceProblem p = reference_problem(spec, scale * dq * dk);
  p.seq_len_q.assign(s.originals->seq_len_q().begin(), s.originals->seq_len_q().end());  // empty without padding
  p.seq_len_kv.assign(s.originals->seq_len_kv().begin(), s.originals->seq_len_kv().end());
  auto dense = [](const TensorDesc& desc) { return DeviceBuffer(static_cast<std::size_t>(desc.elements()) * sizeof(float)); };
  DeviceBuffer qf = dense(spec.q), kf = dense(spec.k), vf = dense(spec.v), of = dense(spec.o);
  DeviceBuffer lse(static_cast<std::size_t>(stats_elements(spec)) * sizeof(float));
  gather_to_float_gpu(spec.q, s.q.get(), qf.as<float>(), nullptr);
  gather_to_float_gpu(spec.k, s.k.get(), kf.as<float>(), nullptr);
  gather_to_float_gpu(spec.v, s.v.get(), vf.as<float>(), nullptr);
  reference_forward_gpu(p, qf.as<float>(), kf.as<float>(), vf.as<float>(), of.as<float>(), lse.as<float>(), nullptr);
  const std::vector<float> o_ref = to_host(of.as<float>(), spec.o.elements(), dv);

  const std::vector<float> o = decoded(spec.o, s.o.get(), s.host(kO, kDescale));
  result.err_o = error_of(o, o_ref);
  result.amax_o = s.host(kO, kAmax);
  result.amax_s = s.host(kS, kAmax);
  result.reference_amax_o = max_abs(o_ref);

  const AttentionSpec& twin = problem.bf16_spec();
  fusedattn::forward(twin, problem.bf16_forward_tensors(), scale, nullptr, problem.workspace());
  result.bf16_o = error_of(o, decoded(twin.o, problem.bf16_forward_tensors().o, 1.0));

  auto amax_close = [](double amax, double reference, double tolerance) {
    return std::fabs(amax - reference) <= tolerance * reference;  // false for NaN
  };
  bool passed = result.err_o <= result.tolerance_forward &&
                amax_close(result.amax_o, result.reference_amax_o, result.tolerance_forward) &&
                result.amax_s >= 1.0 / static_cast<double>(spec.seq_kv()) && result.amax_s <= 1.0 + 1e-6;
  if (backward) {
    const double ddo = s.host(kDO, kDescale);
    DeviceBuffer dof = dense(spec.o), dqf = dense(spec.q), dkf = dense(spec.k), dvf = dense(spec.v);
    gather_to_float_gpu(gradient_desc(spec.o, spec), s.d_o.get(), dof.as<float>(), nullptr);
    reference_backward_gpu(p, qf.as<float>(), kf.as<float>(), vf.as<float>(), of.as<float>(), lse.as<float>(),
                           dof.as<float>(), dqf.as<float>(), dkf.as<float>(), dvf.as<float>(), nullptr);
    const std::vector<float> d_q = decoded(gradient_desc(spec.q, spec), s.d_q.get(), s.host(kDQ, kDescale));
    const std::vector<float> d_k = decoded(gradient_desc(spec.k, spec), s.d_k.get(), s.host(kDK, kDescale));
    const std::vector<float> d_v = decoded(gradient_desc(spec.v, spec), s.d_v.get(), s.host(kDV, kDescale));
    const std::vector<float> d_q_ref = to_host(dqf.as<float>(), spec.q.elements(), dv * ddo / dq);
    const std::vector<float> d_k_ref = to_host(dkf.as<float>(), spec.k.elements(), dv * ddo / dk);
    const std::vector<float> d_v_ref = to_host(dvf.as<float>(), spec.v.elements(), ddo);
    result.err_dq = error_of(d_q, d_q_ref);
    result.err_dk = error_of(d_k, d_k_ref);
    result.err_dv = error_of(d_v, d_v_ref);
    result.amax_dq = s.host(kDQ, kAmax);
    result.amax_dk = s.host(kDK, kAmax);
    result.amax_dv = s.host(kDV, kAmax);
    result.reference_amax_dq = max_abs(d_q_ref);
    result.reference_amax_dk = max_abs(d_k_ref);
    result.reference_amax_dv = max_abs(d_v_ref);
    const BackwardTensors bf16 = problem.bf16_backward_tensors();
    fusedattn::backward(twin, bf16, scale, nullptr, problem.workspace());
    result.bf16_dq = error_of(d_q, decoded(twin.q, bf16.d_q, 1.0));
    result.bf16_dk = error_of(d_k, decoded(twin.k, bf16.d_k, 1.0));
    result.bf16_dv = error_of(d_v, decoded(twin.v, bf16.d_v, 1.0));
    const double t = result.tolerance_backward;
    passed = passed && result.err_dq <= t && result.err_dk <= t && result.err_dv <= t &&
             amax_close(result.amax_dq, result.reference_amax_dq, t) &&
             amax_close(result.amax_dk, result.reference_amax_dk, t) && amax_close(result.amax_dv, result.reference_amax_dv, t);
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(FP8 check)");
  result.passed = passed;  // NaN compares false everywhere above
  return result;
}

}  // namespace fusedattn::check
