// tools/check.h — run one spec on the GPU and compare it with a reference that does not use cuDNN.
//
// The CLI (`fusedattn run`), the GPU tests and the benchmark all check numerics through this one
// implementation, so "passes" means the same thing everywhere: fresh random inputs, poisoned
// outputs, relative L2 error against float64 (CPU) or float32 (GPU) within DESIGN.md §8's tolerance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "fusedattn/attention.h"

namespace fusedattn::check {

/// How to run a check. Defaults give a fresh random problem, forward and backward.
struct CheckOptions {
  bool backward = true;                                    ///< also run and check dQ, dK, dV
  double scale = std::numeric_limits<double>::quiet_NaN();  ///< NaN: default_scale(spec)
  std::uint64_t seed = 0;                                  ///< 0: draw one from std::random_device
};

/// Outcome of one check. Errors are relative L2 errors; NaN means "not computed".
struct CheckResult {
  std::string spec;       ///< to_string(spec): paste it into `fusedattn run` to reproduce
  std::string reference;  ///< "cpu-f64" or "gpu-f32"
  std::uint64_t seed = 0; ///< the seed actually used (pass it back with --seed to get the same inputs)
  double err_o = std::numeric_limits<double>::quiet_NaN();
  double err_stats = std::numeric_limits<double>::quiet_NaN();
  double err_dq = std::numeric_limits<double>::quiet_NaN();
  double err_dk = std::numeric_limits<double>::quiet_NaN();
  double err_dv = std::numeric_limits<double>::quiet_NaN();
  double err_dbias = std::numeric_limits<double>::quiet_NaN();
  double err_dsink = std::numeric_limits<double>::quiet_NaN();
  double err_max_logit = std::numeric_limits<double>::quiet_NaN();
  double keep_rate = std::numeric_limits<double>::quiet_NaN();  ///< dropout: kept fraction of the visible probabilities
  double keep_rate_sigma = std::numeric_limits<double>::quiet_NaN();  ///< its binomial standard deviation
  double tolerance = 0.0;
  bool backward = false;
  bool passed = false;
  /// One line: spec, reference, seed, each error, tolerance, PASS/FAIL.
  std::string to_string() const;
};

/// Relative L2 tolerance for outputs of `dtype` (DESIGN.md §8): bf16 1e-2, f16 2e-3.
double tolerance_for(DType dtype);

/// The dense twin of a ragged spec: each ragged tensor with its sequences in full-length slots
/// (batch stride s * token stride). A ragged spec is checked through it: buffers, references and
/// comparisons are the dense ones, the call is ragged with sequence b starting at token b * s, so
/// the rows past each length are the gaps between sequences. Dense specs come back unchanged.
AttentionSpec ragged_twin(AttentionSpec spec);

/// The dense twin of a paged spec: K and V as [b, h_kv, s_kv, d] in their pages' format (bshd or
/// sbhd). A paged spec is checked through it: the check copies each sequence's pages into the
/// pools at shuffled pages, runs the paged call, and compares with the dense reference.
AttentionSpec paged_twin(AttentionSpec spec);

/// Runs `spec` through fusedattn::forward (and backward) on the current device and compares every
/// output with the reference. Throws InvalidArgument (bad spec), NotSupported (every reason),
/// CudnnError / CudaError / SetupError; a numerical mismatch is not an exception but passed=false.
CheckResult check_against_reference(const AttentionSpec& spec, const CheckOptions& options);

/// Device memory for every tensor of one spec, allocated the way a user of the spec's layout
/// would: when the four descriptors are exactly a named layout's, packed layouts get ONE QKV (or
/// KV) buffer with K and V inside it, and the gradients are packed the same way; otherwise each
/// tensor gets its own buffer of desc.extent() elements. Owns everything it allocates.
class AttentionBuffers {
 public:
  /// `with_backward` also allocates dO, dQ, dK and dV; stats are allocated when spec.stats.
  AttentionBuffers(const AttentionSpec& spec, bool with_backward);
  ~AttentionBuffers();
  AttentionBuffers(const AttentionBuffers&) = delete;
  AttentionBuffers& operator=(const AttentionBuffers&) = delete;

  /// Writes uniform random values in [-1, 1] into Q, K, V (whole buffers, packing gaps included)
  /// and dO, generated on the host with std::mt19937_64(seed). With spec.padding it also draws
  /// each entry's lengths (see draw_lengths) from the same generator. Synchronous.
  void fill_inputs(std::uint64_t seed);
  /// Sets each entry's lengths (spec.padding) and copies them to the device. Synchronous.
  void set_lengths(const std::vector<std::int32_t>& seq_len_q, const std::vector<std::int32_t>& seq_len_kv);
  /// The lengths in use (empty without padding).
  const std::vector<std::int32_t>& seq_len_q() const noexcept;
  const std::vector<std::int32_t>& seq_len_kv() const noexcept;
  /// Writes dropout's seed and offset (int64, device) for the next calls; fill_inputs draws fresh
  /// ones. Synchronous.
  void set_dropout_state(std::int64_t seed, std::int64_t offset);
  /// The sink logits drawn by fill_inputs (Softmax::sink), empty otherwise.
  const std::vector<float>& sink() const noexcept;
  /// Sets every byte of O, stats and the gradient buffers to 0xFF, which is NaN in bf16, f16 and
  /// float32, so any element a kernel forgets to write shows up as an error.
  void poison_outputs();

  ForwardTensors forward_tensors() const;
  BackwardTensors backward_tensors() const;

  /// Host copy of an input buffer as generated (for the CPU reference): the tensor's first element
  /// is at the returned pointer. Valid after fill_inputs(). `which` is "q", "k", "v", "do" or "bias".
  const std::uint16_t* host_input(const std::string& which) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Device memory owned by one object; throws CudaError if cudaMalloc fails.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept { return static_cast<T*>(data_); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// Kernel time of `call` on `stream`: `warmup` untimed calls, then `iters` calls each between a
/// pair of CUDA events, enqueued back to back behind a short host-side hold of the stream and
/// synchronized once at the end, so the calls run back to back and each pair measures GPU time,
/// not launch cost (which matters at small shapes). Returns the median in milliseconds.
double median_kernel_ms(const std::function<void()>& call, int warmup, int iters, cudaStream_t stream);

/// Throws CudaError "<call> failed: <error name> (<description>)" when `status` is not cudaSuccess.
void check_cuda(cudaError_t status, const char* call);

}  // namespace fusedattn::check
