// Internal: timing work on the GPU with stand-in data, on a stream of its own, as autotune
// (exec/autotune.h) and the FP8 backward's choice (fusedattn/fp8_backward_choice.h) do it.
#pragma once

#include <cstddef>
#include <functional>

#include <cuda_runtime_api.h>

namespace fusedattn::detail {

/// Every stand-in byte: a small finite value in each float format (bf16 0.0115, fp16 1.06, e4m3
/// 1.5, float32 0.0115), so that no timing runs on NaN or infinities.
constexpr int kStandInByte = 0x3C;

/// Offsets of stand-in buffers are rounded up to this, which every tensor's alignment divides.
constexpr std::size_t kStandInAlignment = 256;
inline std::size_t stand_in_aligned(std::size_t bytes) {
  return (bytes + kStandInAlignment - 1) / kStandInAlignment * kStandInAlignment;
}

/// The memory, stream and events of one timing, released on every path out (the stream is
/// synchronized first, so nothing in flight outlives its memory).
class Bench {
 public:
  /// A non-blocking stream, two events and `bytes` of device memory. Throws CudaError.
  explicit Bench(std::size_t bytes);
  ~Bench();
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  char* memory() const noexcept { return static_cast<char*>(memory_); }
  cudaStream_t stream() const noexcept { return stream_; }

  /// The median over rounds of one call's time, in milliseconds: `enqueue` (which puts one call
  /// on stream()) runs twice to load its kernels, once to measure it, then in rounds of 1 to 100
  /// calls that last about 20 ms each. Whatever `enqueue` throws goes through.
  double median_ms(const std::function<void()>& enqueue) const;

 private:
  double elapsed_ms() const;
  void release() noexcept;
  void* memory_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace fusedattn::detail
