// bench/host_timing.h — host time per call of enqueueing loops, for the benchmark's C ABI.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include <cuda_runtime_api.h>

#include "testing/cuda_check.h"

namespace fusedattn::bench {

/// Host microseconds per call of `calls` calls of `enqueue`; only enqueueing is timed (the stream
/// is synchronized before and after). Keep the loop short enough that the GPU never falls so far
/// behind that enqueueing has to wait for it.
inline double host_us_per_call(int calls, cudaStream_t stream, const std::function<void()>& enqueue) {
  check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(before host loop)");
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) enqueue();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(after host loop)");
  return us / calls;
}

/// Times `count` loops that take turns for several rounds, each loop reporting its median into
/// medians[i], so that the order they run in and drift of the machine touch none of them more
/// than the others. Every loop runs once first, to warm its path.
inline void interleaved_medians(int calls, cudaStream_t stream, const std::function<void()>* loops, int count,
                                double* const* medians) {
  constexpr int kRounds = 11;
  for (int i = 0; i < count; ++i) loops[i]();
  std::vector<std::vector<double>> samples(static_cast<std::size_t>(count));
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < count; ++i) samples[i].push_back(host_us_per_call(calls, stream, loops[i]));
  }
  for (int i = 0; i < count; ++i) {
    std::sort(samples[i].begin(), samples[i].end());
    *medians[i] = samples[i][kRounds / 2];
  }
}

}  // namespace fusedattn::bench
