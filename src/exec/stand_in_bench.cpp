// Timing with stand-in data on a private stream (exec/stand_in_bench.h).
#include "exec/stand_in_bench.h"

#include <algorithm>
#include <vector>

#include "exec/cuda_check.h"

namespace fusedattn::detail {
namespace {

constexpr double kTimedMsPerRound = 20.0;  // each round runs the work this long (1 to 100 calls)
constexpr int kRounds = 5;

}  // namespace

Bench::Bench(std::size_t bytes) {
  try {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags(stand-in bench)");
    check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop_), "cudaEventCreate");
    if (bytes > 0) check_cuda(cudaMalloc(&memory_, bytes), "cudaMalloc(stand-in data)");
  } catch (...) {
    release();
    throw;
  }
}

Bench::~Bench() { release(); }

void Bench::release() noexcept {
  if (start_) cudaEventDestroy(start_);
  if (stop_) cudaEventDestroy(stop_);
  if (stream_) cudaStreamSynchronize(stream_);
  if (memory_) cudaFree(memory_);
  if (stream_) cudaStreamDestroy(stream_);
  start_ = stop_ = nullptr;
  memory_ = nullptr;
  stream_ = nullptr;
}

double Bench::elapsed_ms() const {
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
  return ms;
}

double Bench::median_ms(const std::function<void()>& enqueue) const {
  for (int i = 0; i < 2; ++i) enqueue();  // loads the kernels
  check_cuda(cudaEventRecord(start_, stream_), "cudaEventRecord");
  enqueue();
  check_cuda(cudaEventRecord(stop_, stream_), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
  const double once = std::max(elapsed_ms(), 1e-3);
  const int calls = std::clamp(static_cast<int>(kTimedMsPerRound / once), 1, 100);
  std::vector<double> rounds;
  for (int round = 0; round < kRounds; ++round) {
    check_cuda(cudaEventRecord(start_, stream_), "cudaEventRecord");
    for (int i = 0; i < calls; ++i) enqueue();
    check_cuda(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    rounds.push_back(elapsed_ms() / calls);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

}  // namespace fusedattn::detail
