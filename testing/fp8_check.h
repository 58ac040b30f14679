// testing/fp8_check.h — one FP8 attention problem on the GPU, and its check against references
// that do not use cuDNN: float32 attention of the dequantized inputs, and fusedattn's own BF16
// result on the unquantized inputs.
//
// The inputs are fresh uniform BF16 values in [-1, 1] (AttentionBuffers of the spec's BF16 twin),
// quantized with current scaling: each tensor's amax measured, its scale set from it
// (fusedattn/fp8.h). The probabilities' scale is fixed (fp8_scales.h says why); the scales of
// the other tensors the kernels quantize (O; dP, dQ, dK, dV) follow delayed scaling with a history
// of one: a first call with unit scales measures their amaxes, and the measured call uses scales
// set from those. Every FP8 output is poisoned before each call.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "fusedattn/attention.h"

namespace fusedattn::check {

/// One FP8 problem: the BF16 originals, their FP8 copies, the scaling tensors and the outputs.
class Fp8Problem {
 public:
  /// `spec`: q, k and v in E4M3 or E5M2, dense (no ragged or paged tensors); with padding=1 each
  /// entry's lengths are drawn as AttentionBuffers draws them, and both passes take them. Synchronous.
  Fp8Problem(const AttentionSpec& spec, bool with_backward, std::uint64_t seed);
  ~Fp8Problem();
  Fp8Problem(const Fp8Problem&) = delete;
  Fp8Problem& operator=(const Fp8Problem&) = delete;

  const AttentionSpec& spec() const noexcept;
  /// The spec with every tensor in BF16 (same dims and strides): the originals' spec.
  const AttentionSpec& bf16_spec() const noexcept;
  ForwardTensors forward_tensors() const;
  BackwardTensors backward_tensors() const;  ///< uses the forward's O and statistics
  /// The BF16 originals' tensor sets (for the BF16 comparison and benchmarks).
  ForwardTensors bf16_forward_tensors() const;
  BackwardTensors bf16_backward_tensors() const;
  /// Device memory enough for every plan of this problem (FP8 and BF16, each pass it has).
  const Workspace& workspace() const noexcept;
  /// Runs the calibration call and the measured one (see above) on the legacy default stream.
  void run_forward(float scale);
  void run_backward(float scale);

  struct State;
  const State& state() const noexcept { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

/// Relative L2 errors per tensor (NaN: not computed) and the amaxes, of one checked FP8 problem.
struct Fp8CheckResult {
  static constexpr double kNotComputed = std::numeric_limits<double>::quiet_NaN();
  std::string spec;
  std::uint64_t seed = 0;
  double err_o = kNotComputed, err_dq = kNotComputed, err_dk = kNotComputed, err_dv = kNotComputed;
  double bf16_o = kNotComputed, bf16_dq = kNotComputed, bf16_dk = kNotComputed, bf16_dv = kNotComputed;
  double amax_o = kNotComputed, reference_amax_o = kNotComputed;  ///< cuDNN's amax of O, and max |O_ref|
  double amax_s = kNotComputed;                                    ///< cuDNN's amax of the probabilities
  /// The backward's amaxes of dQ, dK, dV, and the reference gradients' max |x|.
  double amax_dq = kNotComputed, amax_dk = kNotComputed, amax_dv = kNotComputed;
  double reference_amax_dq = kNotComputed, reference_amax_dk = kNotComputed, reference_amax_dv = kNotComputed;
  double tolerance_forward = 0.0, tolerance_backward = 0.0;
  bool backward = false;
  bool passed = false;
  std::string to_string() const;
};

/// Runs `spec` (FP8, see Fp8Problem) forward, and backward when asked, and checks: O, dQ, dK, dV
/// against the float32 reference of the dequantized inputs within the format's tolerance (forward:
/// 2^-(m+1) with m the mantissa bits, the largest relative rounding of one FP8 value, 1/16 for
/// E4M3; backward: twice the gradients' format's, for the second quantized product dP); amax_o equal to max |O_ref|
/// within the forward tolerance, and the gradients' amaxes equal to the reference's within the
/// backward tolerance; amax_s in [1/s_kv, 1]. The errors against fusedattn's BF16 result (which also see
/// the inputs' quantization) are reported, not judged. NaN never passes.
Fp8CheckResult check_fp8_against_reference(const AttentionSpec& spec, bool backward, std::uint64_t seed);

}  // namespace fusedattn::check
