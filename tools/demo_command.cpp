// `fusedattn demo`: with a GPU, a checked forward+backward on a standard problem and on odd sizes;
// without one, the CPU float64 reference on a small problem, with its self-checks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <vector>

#include "bench.h"
#include "commands.h"
#include "common.h"
#include "fusedattn/build_info.h"
#include "fusedattn/layout.h"
#include "fusedattn/reference.h"
#include "testing/attention_buffers.h"
#include "testing/reference_check.h"

namespace fusedattn::cli {
namespace {

AttentionSpec causal_spec(const ProblemShape& shape, Alignment alignment) {
  AttentionSpec spec = spec_for_layout(Layout::bshd, shape);
  spec.window = kCausal;
  spec.alignment = alignment;
  return spec;
}

bool demo_check(const std::string& title, const AttentionSpec& spec) {
  std::cout << title << "\n";
  const check::CheckResult result = check::check_against_reference(spec, {});
  std::cout << "  " << result.to_string() << "\n";
  return result.passed;
}

int demo_gpu() {
  std::cout << build_info().to_string() << "\n\n";
  ProblemShape standard;
  standard.dtype = DType::bf16;
  standard.batch = 2;
  standard.seq_q = standard.seq_kv = 2048;
  standard.heads_q = standard.heads_kv = 16;
  standard.head_dim_qk = standard.head_dim_v = 128;
  const AttentionSpec first = causal_spec(standard, Alignment::top_left);
  bool ok = demo_check("1. standard problem (bf16, bshd, causal), forward + backward:", first);
  AttentionSpec first_train = first;
  first_train.stats = true;
  check::AttentionBuffers first_buffers(first_train, /*with_backward=*/true);
  first_buffers.fill_inputs(std::random_device{}());
  const BenchResult timing = run_bench(first, 10, first_buffers.forward_tensors(), first_buffers.backward_tensors(),
                                        nullptr);
  std::printf("  forward %.3f ms = %.0f TFLOP/s, forward+backward %.3f ms = %.0f TFLOP/s  spec=%s\n\n",
              timing.forward_ms, first.forward_flops() / (timing.forward_ms * 1e9), timing.forward_backward_ms,
              3.5 * first.forward_flops() / (timing.forward_backward_ms * 1e9), quoted(first).c_str());

  ProblemShape odd = standard;
  odd.seq_q = 1000;
  odd.seq_kv = 1500;
  odd.heads_kv = 4;
  const AttentionSpec second = causal_spec(odd, Alignment::bottom_right);
  ok = demo_check("2. odd sizes (s_q=1000, s_kv=1500, GQA 16/4, causal bottom-right), forward + backward:", second) && ok;
  std::cout << (ok ? "demo: PASS" : "demo: FAIL") << "\n";
  return ok ? kOk : kFailed;
}

// Contiguous [b, h, s, d] doubles, uniform in [-1, 1].
std::vector<double> random_tensor(std::int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> values(static_cast<std::size_t>(n));
  for (double& value : values) value = uniform(rng);
  return values;
}

struct CpuTensors {
  std::vector<double> q, k, v, d_o, o, lse, dq, dk, dv;
};

void cpu_forward_backward(const ReferenceProblem& p, CpuTensors& t) {
  t.o.assign(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q * p.head_dim_v), 0.0);
  t.lse.assign(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q), 0.0);
  t.dq.assign(t.q.size(), 0.0);
  t.dk.assign(t.k.size(), 0.0);
  t.dv.assign(t.v.size(), 0.0);
  reference_forward_cpu(p, t.q.data(), t.k.data(), t.v.data(), t.o.data(), t.lse.data());
  reference_backward_cpu(p, t.q.data(), t.k.data(), t.v.data(), t.d_o.data(), t.dq.data(), t.dk.data(),
                             t.dv.data());
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return std::isnan(worst) ? INFINITY : worst;
}

// K or V of a GQA problem with each head repeated for the query heads that share it.
std::vector<double> repeat_heads(const std::vector<double>& x, const ReferenceProblem& p, std::int64_t dim) {
  const std::int64_t group = p.heads_q / p.heads_kv, block = p.seq_kv * dim;
  std::vector<double> out(static_cast<std::size_t>(p.batch * p.heads_q * block));
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      std::copy_n(x.begin() + (b * p.heads_kv + h / group) * block, block, out.begin() + (b * p.heads_q + h) * block);
  return out;
}

// Gradient of a GQA K/V head: the sum over the query heads that share it.
std::vector<double> sum_groups(const std::vector<double>& x, const ReferenceProblem& p, std::int64_t dim) {
  const std::int64_t group = p.heads_q / p.heads_kv, block = p.seq_kv * dim;
  std::vector<double> out(static_cast<std::size_t>(p.batch * p.heads_kv * block), 0.0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < block; ++i)
        out[(b * p.heads_kv + h / group) * block + i] += x[(b * p.heads_q + h) * block + i];
  return out;
}

// GQA must equal MHA with repeated K/V heads (and summed K/V gradients).
double gqa_self_check(const ReferenceProblem& p, const CpuTensors& gqa) {
  ReferenceProblem mha_problem = p;
  mha_problem.heads_kv = p.heads_q;
  CpuTensors mha;
  mha.q = gqa.q;
  mha.k = repeat_heads(gqa.k, p, p.head_dim_qk);
  mha.v = repeat_heads(gqa.v, p, p.head_dim_v);
  mha.d_o = gqa.d_o;
  cpu_forward_backward(mha_problem, mha);
  return std::max({max_abs_diff(gqa.o, mha.o), max_abs_diff(gqa.dq, mha.dq),
                   max_abs_diff(gqa.dk, sum_groups(mha.dk, p, p.head_dim_qk)),
                   max_abs_diff(gqa.dv, sum_groups(mha.dv, p, p.head_dim_v))});
}

// sum(O * dO): the loss whose gradients reference_backward_cpu returns.
double loss(const ReferenceProblem& p, const CpuTensors& t) {
  std::vector<double> o(t.o.size()), lse(t.lse.size());
  reference_forward_cpu(p, t.q.data(), t.k.data(), t.v.data(), o.data(), lse.data());
  double sum = 0.0;
  for (std::size_t i = 0; i < o.size(); ++i) sum += o[i] * t.d_o[i];
  return sum;
}

// Central finite differences of the loss at a few elements of Q, K and V, against the analytic
// gradients; returns the worst relative difference.
double finite_difference_check(const ReferenceProblem& p, const CpuTensors& t) {
  constexpr double kStep = 1e-5;
  double worst = 0.0;
  CpuTensors probe = t;
  auto check = [&](std::vector<double>& input, const std::vector<double>& grad, std::size_t index) {
    const double saved = input[index];
    input[index] = saved + kStep;
    const double up = loss(p, probe);
    input[index] = saved - kStep;
    const double down = loss(p, probe);
    input[index] = saved;
    const double numeric = (up - down) / (2 * kStep);
    worst = std::max(worst, std::fabs(numeric - grad[index]) / std::max(1e-3, std::fabs(grad[index])));
  };
  for (std::size_t index : {std::size_t{3}, t.q.size() / 2, t.q.size() - 5}) check(probe.q, t.dq, index);
  for (std::size_t index : {std::size_t{7}, t.k.size() - 9}) check(probe.k, t.dk, index);
  for (std::size_t index : {std::size_t{11}, t.v.size() / 3}) check(probe.v, t.dv, index);
  return worst;
}

// L2 norm of the finite values: a checksum that, unlike a plain sum, does not vanish for dK
// (whose sum over keys is zero, because each softmax row's gradient sums to zero).
double norm(const std::vector<double>& x) {
  double sum = 0.0;
  for (double value : x)
    if (std::isfinite(value)) sum += value * value;
  return std::sqrt(sum);
}

int demo_cpu(const std::string& reason) {
  std::cout << "no GPU found (" << reason << "): running the CPU float64 reference on a small problem instead\n";
  ProblemShape shape;
  shape.batch = 2;
  shape.seq_q = 37;
  shape.seq_kv = 53;
  shape.heads_q = 4;
  shape.heads_kv = 2;
  shape.head_dim_qk = 32;
  shape.head_dim_v = 24;
  const AttentionSpec spec = causal_spec(shape, Alignment::bottom_right);
  const ReferenceProblem p = reference_problem(spec, default_scale(spec));
  std::mt19937_64 rng(2024);
  CpuTensors t;
  t.q = random_tensor(spec.q.elements(), rng);
  t.k = random_tensor(spec.k.elements(), rng);
  t.v = random_tensor(spec.v.elements(), rng);
  t.d_o = random_tensor(spec.o.elements(), rng);
  cpu_forward_backward(p, t);
  std::printf("problem spec=%s scale=%.6f\n", quoted(spec).c_str(), p.scale);
  std::printf("  L2 norms: O %.9f  lse %.9f  dQ %.9f  dK %.9f  dV %.9f\n", norm(t.o), norm(t.lse), norm(t.dq),
              norm(t.dk), norm(t.dv));
  const double gqa = gqa_self_check(p, t);
  const double fd = finite_difference_check(p, t);
  const bool gqa_ok = gqa <= 1e-12, fd_ok = fd <= 1e-6;
  std::printf("  self-check: GQA 4/2 equals MHA with repeated K/V heads: max |diff| %.2e  %s\n", gqa,
              gqa_ok ? "PASS" : "FAIL");
  std::printf("  self-check: gradients match central finite differences: worst relative diff %.2e  %s\n", fd,
              fd_ok ? "PASS" : "FAIL");
  return gqa_ok && fd_ok ? kOk : kFailed;
}

}  // namespace

int demo_command(const CommandLine&) {
  const std::string no_gpu = gpu_unavailable();
  return no_gpu.empty() ? demo_gpu() : demo_cpu(no_gpu);
}

}  // namespace fusedattn::cli
