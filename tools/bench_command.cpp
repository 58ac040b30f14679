// `fusedattn bench SPEC`: kernel time and TFLOP/s of each pass, host time of a cached call, and
// the plans' build and disk-restore times.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>

#include "bench.h"
#include "commands.h"
#include "common.h"
#include "fusedattn/build_info.h"
#include "fusedattn/disk_cache.h"
#include "testing/attention_buffers.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/fp8_check.h"
#include "testing/kernel_timing.h"

namespace fusedattn::cli {
namespace {

// Builds both plans from a cold cache with the disk cache off, timing each on the host (the
// backward where supported); then, with the disk cache on, restores them from it as a new
// process would (their entries written first where missing), timed too.
void measure_builds(const AttentionSpec& train, BenchResult* r) {
  const std::string folder = plan_dir();
  set_plan_dir("");
  clear_plan_cache();
  auto start = std::chrono::steady_clock::now();
  get_plan(train, Pass::forward);
  r->build_forward_ms = ms_since(start);
  start = std::chrono::steady_clock::now();
  const Support backward = check_support(train, Pass::backward);
  r->build_backward_ms = ms_since(start);
  if (!backward.ok()) r->backward_refused = backward.to_string();
  set_plan_dir(folder);
  if (folder.empty()) return;
  for (int round = 0; round < 2; ++round) {  // the first writes what is missing, the second is timed
    clear_plan_cache();
    start = std::chrono::steady_clock::now();
    get_plan(train, Pass::forward);
    r->restore_forward_ms = ms_since(start);
    if (!backward.ok()) continue;
    start = std::chrono::steady_clock::now();
    get_plan(train, Pass::backward);
    r->restore_backward_ms = ms_since(start);
  }
}

void print_bench(const AttentionSpec& spec, const BenchResult& r, int iters) {
  const double fwd_flops = spec.forward_flops();
  auto tflops = [](double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
  std::printf("bench spec=%s  (median of %d calls, CUDA events)\n", quoted(spec).c_str(), iters);
  std::printf("  %-26s %12s %10s\n", "pass", "kernel ms", "TFLOP/s");
  std::printf("  %-26s %12.4f %10.1f\n", "forward", r.forward_ms, tflops(fwd_flops, r.forward_ms));
  if (r.backward_refused.empty()) {
    std::printf("  %-26s %12.4f %10.1f\n", "forward+backward", r.forward_backward_ms,
                tflops(3.5 * fwd_flops, r.forward_backward_ms));
    std::printf("  %-26s %12.4f %10.1f\n", "backward", r.backward_ms, tflops(2.5 * fwd_flops, r.backward_ms));
  } else {
    std::printf("  backward not supported: %s\n", r.backward_refused.substr(0, 300).c_str());
  }
  std::printf("  %-26s %12.2f us\n", "host time per cached call", r.host_us_per_call);
  std::printf("  %-26s %12.1f ms forward, %.1f ms backward\n", "plan build", r.build_forward_ms, r.build_backward_ms);
  if (r.restore_forward_ms >= 0) {
    std::printf("  %-26s %12.1f ms forward, %.1f ms backward (%s)\n", "plan restored from disk", r.restore_forward_ms,
                r.restore_backward_ms, plan_dir().c_str());
  }
  std::printf("  %-26s builds=%llu build_ms=%.1f hits=%llu misses=%llu size=%zu\n", "plan cache",
              static_cast<unsigned long long>(r.cache.builds), r.cache.build_ms,
              static_cast<unsigned long long>(r.cache.hits), static_cast<unsigned long long>(r.cache.misses),
              r.cache.size);
}

}  // namespace

BenchResult run_bench(const AttentionSpec& spec, int iters, const ForwardTensors& fwd, const BackwardTensors& bwd,
                      Progress* progress) {
  auto step = [&](const char* done) {
    if (progress) progress->advance(done);
  };
  AttentionSpec train = spec;
  train.stats = true;  // backward needs the forward's statistics
  BenchResult r;
  measure_builds(train, &r);
  step("plans built and restored");
  const bool with_backward = r.backward_refused.empty();
  const std::size_t ws_bytes =
      std::max(get_plan(spec, Pass::forward)->workspace_bytes(),
               with_backward ? get_plan(train, Pass::backward)->workspace_bytes() : std::size_t{0});
  check::DeviceBuffer workspace_memory(ws_bytes);
  const Workspace ws{workspace_memory.get(), ws_bytes};
  ForwardTensors inference = fwd;
  if (!spec.stats) inference.stats = nullptr;
  const float scale = default_scale(spec);

  r.forward_ms = check::median_kernel_ms([&] { forward(spec, inference, scale, nullptr, ws); }, 3, iters, nullptr);
  step("forward timed");
  if (with_backward) {
    r.forward_backward_ms = check::median_kernel_ms(
        [&] {
          forward(train, fwd, scale, nullptr, ws);
          backward(train, bwd, scale, nullptr, ws);
        },
        3, iters, nullptr);
    step("forward+backward timed");
    r.backward_ms = check::median_kernel_ms([&] { backward(train, bwd, scale, nullptr, ws); }, 3, iters, nullptr);
    step("backward timed");
  } else {
    step("backward not supported");
    step("backward not supported");
  }

  // Enqueue cost of a cached call. Fewer calls than the launch queue holds (about a thousand
  // pending launches), so that enqueueing never waits for a kernel to finish, whatever the shape.
  constexpr int kHostCalls = 200;
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kHostCalls; ++i) forward(spec, inference, scale, nullptr, ws);
  r.host_us_per_call = ms_since(start) * 1000.0 / kHostCalls;
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  step("host time measured");
  r.cache = plan_cache_stats();
  return r;
}

int bench_command(const CommandLine& line) {
  const AttentionSpec spec = valid_spec(line).spec();
  const int iters = static_cast<int>(std::max<std::uint64_t>(1, line.count("--iters", 20)));
  const std::string no_gpu = gpu_unavailable();
  if (!no_gpu.empty()) {
    std::cout << "no GPU: " << no_gpu << "  spec=" << quoted(spec) << "\n";
    return kNoGpu;
  }
  std::cout << build_info().to_string() << "\n";
  try {
    AttentionSpec train = spec;
    train.stats = true;
    if (is_fp8(spec.q.dtype)) {  // FP8, then its BF16 twin on the same (unquantized) inputs
      Progress progress("bench", "steps", 2 * kBenchSteps);
      check::Fp8Problem problem(train, /*with_backward=*/true, std::random_device{}());
      problem.run_forward(default_scale(spec));  // scales of S, O, dP and the gradients from their amaxes
      problem.run_backward(default_scale(spec));
      const BenchResult fp8 = run_bench(spec, iters, problem.forward_tensors(), problem.backward_tensors(), &progress);
      AttentionSpec bf16 = problem.bf16_spec();
      bf16.stats = spec.stats;
      const BenchResult twin =
          run_bench(bf16, iters, problem.bf16_forward_tensors(), problem.bf16_backward_tensors(), &progress);
      progress.finish();
      print_bench(spec, fp8, iters);
      print_bench(bf16, twin, iters);
      std::printf("FP8 / BF16 speed: forward %.3f, backward %.3f, forward+backward %.3f\n",
                  twin.forward_ms / fp8.forward_ms, twin.backward_ms / fp8.backward_ms,
                  twin.forward_backward_ms / fp8.forward_backward_ms);
      return kOk;
    }
    Progress progress("bench", "steps", kBenchSteps);
    check::AttentionBuffers buffers(train, /*with_backward=*/true);
    buffers.fill_inputs(std::random_device{}());
    const BenchResult result = run_bench(spec, iters, buffers.forward_tensors(), buffers.backward_tensors(), &progress);
    progress.finish();
    print_bench(spec, result, iters);
  } catch (const NotSupported& error) {
    print_not_supported(error, spec);
    return kNotSupported;
  }
  return kOk;
}

}  // namespace fusedattn::cli
