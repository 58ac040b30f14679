// GPU tier: 16 threads making 10,000 mixed calls each into one process — forwards and backwards
// of eight specs that every thread shares, from an empty plan cache. Each (spec, pass) is built
// exactly once (single-flight), and every call's result is checked: equal, byte for byte, to what
// one thread got alone on the same inputs (the backward runs cuDNN's deterministic algorithm),
// which in turn is checked against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "plan_folders.h"
#include "fusedattn/attention.h"
#include "fusedattn/plan_cache.h"
#include "gpu_skip.h"
#include "testing/attention_buffers.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/reference_check.h"

namespace fusedattn {
namespace {

using check::AttentionBuffers;
using check::DeviceBuffer;

constexpr int kThreads = 16;

// 10,000 calls a thread; FUSEDATTN_THREADS_CALLS sets fewer for a ThreadSanitizer build, whose
// every memory access is checked (the GPU script's tsan part).
int calls_per_thread() {
  const char* text = std::getenv("FUSEDATTN_THREADS_CALLS");
  const int calls = text ? std::atoi(text) : 0;
  return calls > 0 ? calls : 10000;
}

const char* const kSpecs[] = {
    "layout=bshd dtype=bf16 b=2 s_q=128 s_kv=128 h_q=4 h_kv=4 d=64 deterministic=1",
    "layout=bshd dtype=bf16 b=1 s_q=96 s_kv=200 h_q=8 h_kv=2 d=64 causal align=bottom_right deterministic=1",
    "layout=sbhd dtype=f16 b=2 s_q=64 s_kv=64 h_q=4 h_kv=1 d=128 causal deterministic=1",
    "layout=bhsd dtype=bf16 b=1 s_q=160 s_kv=160 h_q=2 h_kv=2 d=64 window=32,0 deterministic=1",
    "layout=bshd dtype=bf16 b=2 s_q=80 s_kv=80 h_q=4 h_kv=4 d=64 causal deterministic=1",
    "layout=bshd dtype=bf16 b=2 s_q=72 s_kv=136 h_q=4 h_kv=4 d=64 bias=1hss bias_grad=1 deterministic=1",
    "layout=bshd dtype=bf16 b=1 s_q=64 s_kv=64 h_q=4 h_kv=4 d=64 softmax=sink deterministic=1",
    "layout=sbhd dtype=f16 b=1 s_q=112 s_kv=112 h_q=4 h_kv=4 d=64 causal deterministic=1",
};
constexpr int kSpecCount = sizeof kSpecs / sizeof kSpecs[0];

std::vector<unsigned char> download(const void* data, std::size_t bytes) {
  std::vector<unsigned char> host(bytes);
  check::check_cuda(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}

std::size_t bytes_of(const TensorDesc& desc) { return static_cast<std::size_t>(desc.extent()) * size_of(desc.dtype); }

// One spec's inputs (shared, read-only) and what one thread alone got from them.
struct Shared {
  AttentionSpec spec;
  std::unique_ptr<AttentionBuffers> buffers;
  std::vector<unsigned char> o, d_q, d_k, d_v;
};

// A thread's own outputs for one spec: O and the statistics, and the gradients (dBias and dSink
// too, not compared: no two threads write one buffer).
struct Outputs {
  DeviceBuffer o, stats, d_q, d_k, d_v, d_bias, d_sink, workspace;
};

TEST(Threads, SixteenThreadsOfMixedCallsBuildEachPlanOnceAndAllGetTheSameResults) {
  FUSEDATTN_REQUIRE_GPU();
  DiskCacheOff off;
  std::vector<Shared> shared(kSpecCount);
  for (int i = 0; i < kSpecCount; ++i) {
    Shared& s = shared[static_cast<std::size_t>(i)];
    s.spec = parse_spec(kSpecs[i]);
    check::CheckOptions options;  // the plans against the reference, on fresh inputs of their own
    const check::CheckResult result = check::check_against_reference(s.spec, options);
    ASSERT_TRUE(result.passed) << result.to_string();
    s.buffers = std::make_unique<AttentionBuffers>(s.spec, true);
    s.buffers->fill_inputs(1000 + static_cast<std::uint64_t>(i));
    const float scale = default_scale(s.spec);
    const auto forward_plan = get_plan(s.spec, Pass::forward), backward_plan = get_plan(s.spec, Pass::backward);
    DeviceBuffer workspace(std::max(forward_plan->workspace_bytes(), backward_plan->workspace_bytes()));
    forward_plan->run(s.buffers->forward_tensors(), scale, nullptr, {workspace.get(), workspace.bytes()});
    backward_plan->run(s.buffers->backward_tensors(), scale, nullptr, {workspace.get(), workspace.bytes()});
    check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const BackwardTensors b = s.buffers->backward_tensors();
    s.o = download(b.o, bytes_of(s.spec.o));
    s.d_q = download(b.d_q, bytes_of(s.spec.q));
    s.d_k = download(b.d_k, bytes_of(s.spec.k));
    s.d_v = download(b.d_v, bytes_of(s.spec.v));
  }
  clear_plan_cache();
  const CacheStats before = plan_cache_stats();
  const int calls_each = calls_per_thread();

  std::atomic<long> mismatches{0}, calls{0};
  std::mutex first_mutex;
  std::string first;
  auto note = [&](const std::string& what) {
    mismatches.fetch_add(1);
    std::lock_guard<std::mutex> lock(first_mutex);
    if (first.empty()) first = what;
  };
  auto work = [&](int thread) {
    cudaStream_t stream = nullptr;
    check::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    std::vector<Outputs> mine(kSpecCount);
    std::mt19937_64 rng(static_cast<std::uint64_t>(thread) * 7919 + 1);
    std::vector<unsigned char> got;
    for (int call = 0; call < calls_each; ++call) {
      const int i = static_cast<int>(rng() % kSpecCount);
      const Pass pass = rng() % 2 ? Pass::backward : Pass::forward;
      const Shared& s = shared[static_cast<std::size_t>(i)];
      Outputs& out = mine[static_cast<std::size_t>(i)];
      try {
        const auto plan = get_plan(s.spec, pass);
        if (out.workspace.bytes() < plan->workspace_bytes()) out.workspace = DeviceBuffer(plan->workspace_bytes());
        const Workspace workspace{out.workspace.get(), out.workspace.bytes()};
        const float scale = default_scale(s.spec);
        if (pass == Pass::forward) {
          if (!out.o.get()) {
            out.o = DeviceBuffer(s.o.size());
            out.stats = DeviceBuffer(static_cast<std::size_t>(check::stats_elements(s.spec)) * sizeof(float));
          }
          ForwardTensors t = s.buffers->forward_tensors();
          t.o = out.o.get();
          t.stats = out.stats.as<float>();
          plan->run(t, scale, stream, workspace);
          got.resize(s.o.size());
          check::check_cuda(cudaMemcpyAsync(got.data(), out.o.get(), got.size(), cudaMemcpyDeviceToHost, stream), "copy");
          check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          if (std::memcmp(got.data(), s.o.data(), got.size()) != 0) note(std::string("O of ") + kSpecs[i]);
        } else {
          if (!out.d_q.get()) {
            out.d_q = DeviceBuffer(s.d_q.size());
            out.d_k = DeviceBuffer(s.d_k.size());
            out.d_v = DeviceBuffer(s.d_v.size());
            if (s.spec.bias_grad) out.d_bias = DeviceBuffer(bytes_of(bias_desc(s.spec)));
            if (s.spec.softmax == Softmax::sink) {
              out.d_sink = DeviceBuffer(static_cast<std::size_t>(s.spec.heads_q()) * sizeof(float));
            }
          }
          BackwardTensors t = s.buffers->backward_tensors();
          t.d_q = out.d_q.get();  // separate layouts only: each gradient is its buffer, gaps and all
          t.d_k = out.d_k.get();
          t.d_v = out.d_v.get();
          if (s.spec.bias_grad) t.d_bias = out.d_bias.get();
          if (s.spec.softmax == Softmax::sink) t.d_sink = out.d_sink.as<float>();
          plan->run(t, scale, stream, workspace);
          for (auto [device, want, name] : {std::tuple<const void*, const std::vector<unsigned char>*, const char*>{
                                                out.d_q.get(), &s.d_q, "dQ"},
                                            {out.d_k.get(), &s.d_k, "dK"},
                                            {out.d_v.get(), &s.d_v, "dV"}}) {
            got.resize(want->size());
            check::check_cuda(cudaMemcpyAsync(got.data(), device, got.size(), cudaMemcpyDeviceToHost, stream), "copy");
            check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
            if (std::memcmp(got.data(), want->data(), got.size()) != 0) note(std::string(name) + " of " + kSpecs[i]);
          }
        }
        calls.fetch_add(1);
      } catch (const std::exception& error) {
        note(error.what());
      }
    }
    cudaStreamDestroy(stream);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (std::thread& t : threads) t.join();

  const CacheStats after = plan_cache_stats();
  EXPECT_EQ(calls.load(), static_cast<long>(kThreads) * calls_each);
  EXPECT_EQ(mismatches.load(), 0) << "first: " << first;
  EXPECT_EQ(after.builds - before.builds, 2u * kSpecCount) << "each (spec, pass) built once";
  EXPECT_EQ(after.misses - before.misses, 2u * kSpecCount);
  EXPECT_EQ(after.failed_builds, before.failed_builds);
  std::printf("threads: %d x %d calls, %ld mismatches, %llu builds\n", kThreads, calls_each, mismatches.load(),
              static_cast<unsigned long long>(after.builds - before.builds));
}

}  // namespace
}  // namespace fusedattn
