// bench/host_timing.h — host time per call of enqueueing loops, timed in C++ (a loop timed from
// Python would measure Python).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

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

/// The median host microseconds per call of each of `loops`, which take turns for `rounds` rounds
/// so that the order they run in and drift of the machine touch none of them more than the others.
/// Every loop runs once first, to warm its path.
inline std::vector<double> interleaved_medians(int calls, cudaStream_t stream,
                                               const std::vector<std::function<void()>>& loops, int rounds = 11) {
  for (const auto& loop : loops) loop();
  std::vector<std::vector<double>> samples(loops.size());
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t i = 0; i < loops.size(); ++i) samples[i].push_back(host_us_per_call(calls, stream, loops[i]));
  }
  std::vector<double> medians;
  for (auto& values : samples) {
    std::sort(values.begin(), values.end());
    medians.push_back(values[values.size() / 2]);
  }
  return medians;
}

}  // namespace fusedattn::bench
