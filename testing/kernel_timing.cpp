// testing/kernel_timing.cpp — median_kernel_ms: event pairs behind a held stream.
#include "testing/kernel_timing.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "testing/cuda_check.h"

namespace fusedattn::check {
namespace {

// A CUDA event that destroys itself.
class Event {
 public:
  Event() { check_cuda(cudaEventCreate(&event_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const noexcept { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Holds the stream on the host for a while, so that the calls enqueued behind it pile up and then
// run back to back: events then measure GPU time even where launching is slower than running.
void CUDART_CB hold_stream(void* milliseconds) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*static_cast<const double*>(milliseconds)));
}

}  // namespace

double median_kernel_ms(const std::function<void()>& call, int warmup, int iters, cudaStream_t stream) {
  if (iters < 1) iters = 1;
  for (int i = 0; i < warmup; ++i) call();
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(after warm-up)");
  std::vector<std::unique_ptr<Event>> start, stop;
  for (int i = 0; i < iters; ++i) {
    start.emplace_back(new Event);
    stop.emplace_back(new Event);
  }
  static double hold_ms = 20.0;  // far longer than enqueueing a few dozen calls takes
  check_cuda(cudaLaunchHostFunc(stream, hold_stream, &hold_ms), "cudaLaunchHostFunc(hold_stream)");
  for (int i = 0; i < iters; ++i) {
    check_cuda(cudaEventRecord(start[i]->get(), stream), "cudaEventRecord(start)");
    call();
    check_cuda(cudaEventRecord(stop[i]->get(), stream), "cudaEventRecord(stop)");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(after timed calls)");
  std::vector<double> ms(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    float elapsed = 0.0f;
    check_cuda(cudaEventElapsedTime(&elapsed, start[i]->get(), stop[i]->get()), "cudaEventElapsedTime");
    ms[static_cast<std::size_t>(i)] = elapsed;
  }
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return ms[static_cast<std::size_t>(iters / 2)];
}

}  // namespace fusedattn::check
