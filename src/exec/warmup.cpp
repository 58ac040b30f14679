// Warm-up: plans of many specs reached in parallel threads (fusedattn/warmup.h). The plan cache is
// single-flight and each thread has its own cuDNN handle, so the threads only share the GPU.
#include "fusedattn/warmup.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include "cache/plan_store.h"
#include "exec/cuda_check.h"
#include "exec/device.h"

namespace fusedattn {
namespace {

constexpr int kMostThreads = 8;

WarmupResult warm(const AttentionSpec& spec, Pass pass, const PlanOptions& options) {
  WarmupResult result;
  result.spec = spec;
  result.pass = pass;
  const auto start = std::chrono::steady_clock::now();
  try {
    validate(spec);  // InvalidArgument into the result's message, as every failure
    const Support support = detail::find_or_build(spec, pass, options)->support;
    result.ok = support.ok();
    if (!result.ok) result.message = support.to_string();
  } catch (const std::exception& error) {
    result.message = error.what();
  }
  result.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace

std::vector<WarmupResult> warm_up(const std::vector<AttentionSpec>& specs, const std::vector<Pass>& passes,
                                  const WarmupOptions& options) {
  std::vector<WarmupResult> results(specs.size() * passes.size());
  if (results.empty()) return results;
  const int device = detail::current_device();
  int threads = options.threads > 0 ? options.threads
                                    : std::min(kMostThreads, static_cast<int>(std::thread::hardware_concurrency()));
  threads = std::clamp(threads, 1, static_cast<int>(results.size()));
  std::atomic<std::size_t> next{0};
  std::mutex progress;
  std::size_t done = 0;  // under `progress`
  auto work = [&] {
    detail::check_cuda(cudaSetDevice(device), "cudaSetDevice(warm-up thread)");
    detail::handle_for(device, nullptr);  // the thread's cuDNN handle, so that no plan's time includes it
    for (std::size_t i = next++; i < results.size(); i = next++) {
      results[i] = warm(specs[i / passes.size()], passes[i % passes.size()], options.plan);
      if (!options.progress) continue;
      std::lock_guard<std::mutex> lock(progress);
      options.progress(++done, results.size());
    }
  };
  std::vector<std::thread> pool;
  std::mutex failure;
  std::exception_ptr failed;  // only cudaSetDevice throws out of work()
  for (int t = 1; t < threads; ++t) pool.emplace_back([&] {
    try {
      work();
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure);
      failed = std::current_exception();
    }
  });
  work();
  for (std::thread& thread : pool) thread.join();
  if (failed) std::rethrow_exception(failed);
  return results;
}

}  // namespace fusedattn
