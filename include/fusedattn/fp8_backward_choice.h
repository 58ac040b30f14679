// fusedattn/fp8_backward_choice.h — which backward follows an FP8 forward in training, chosen by
// measurement.
//
// After an FP8 forward, the gradients can come from cuDNN's FP8 backward (dO quantized before it,
// dQ, dK and dV dequantized after it) or from the backward in the model's precision (bf16 or f16)
// on the unquantized inputs. Which is faster depends on the shape, so it is measured. On the H200
// with cuDNN 9.19, a training step through the public API against BF16's: 2x8k h16 causal 1.20x
// with the FP8 backward, 1.04x with the model's; 4x4k h32 1.23x against 1.07x; but 1x8k h64/8
// causal 1.02x against 1.08x (the FP8 backward expands grouped K/V heads and sums dK, dV over the
// groups) and 8x2k h32 causal 0.66x against 0.93x.
//
// Each answer is measured once per process (memoized per spec, model dtype and device, bounded as
// the plan cache is) and kept in the disk cache's folder (fusedattn/disk_cache.h) under a key with
// the GPU, the driver, cuDNN and fusedattn's build, so each machine measures a shape once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fusedattn/spec.h"

namespace fusedattn {

/// The two backwards after an FP8 forward.
enum class Fp8Backward : std::uint8_t {
  fp8,    ///< cuDNN's FP8 backward, with dO's quantization and the gradients' dequantization
  model,  ///< the backward of the same spec in the model's dtype
};
/// "fp8" or "model".
const char* to_string(Fp8Backward backward) noexcept;

/// The answer, with the times it rests on.
struct Fp8BackwardChoice {
  Fp8Backward chosen = Fp8Backward::fp8;
  /// Median time of cuDNN's FP8 backward as fusedattn runs it (the public backward entry, so any
  /// K/V expansion is in it) plus quantize_fp8_many of dO and dequantize_fp8_many of dQ, dK, dV;
  /// negative where the FP8 backward is not supported for the spec (then the model's is chosen).
  double fp8_ms = 0.0;
  double model_ms = 0.0;  ///< median time of the model-precision backward of the same spec
};

/// Which backward is faster after an FP8 forward of `spec` (an FP8 spec with per-tensor scaling)
/// when the model computes in `model_dtype` (bf16 or f16), on the current device. Measured on
/// stand-in data that it allocates (no caller's memory is touched), on a stream of its own, with
/// the GPU synchronized; works while another stream of the process is being captured. From the
/// second call for a spec on, the answer comes from memory, or from the disk cache in a later
/// process. Throws InvalidArgument for a spec it cannot stand in for (naming the field: ragged,
/// paged, padded, bias, dropout, a softmax other than vanilla, a score modifier), NotSupported
/// where the model-precision backward is not supported, CudaError or CudnnError.
Fp8BackwardChoice choose_fp8_backward(const AttentionSpec& spec, DType model_dtype);

/// The answer for `spec` and `model_dtype` on the current device if this process has it in
/// memory, without measuring; nullopt otherwise (or without a GPU).
std::optional<Fp8BackwardChoice> known_fp8_backward_choice(const AttentionSpec& spec, DType model_dtype);

/// What the support query reports about the backward of `spec` after an FP8 forward: "fp8" or
/// "model" where this process has measured it (for a bf16 model, else an f16 one), "not measured"
/// where it has not, and "" for a spec that is not FP8 with per-tensor scaling.
std::string fp8_backward_report(const AttentionSpec& spec);

/// Forgets the answers held in memory (those in the disk cache stay), as clear_plan_cache does plans.
void clear_fp8_backward_choices();

/// How many measurements choose_fp8_backward has run in this process (answers from memory or
/// from the disk cache are not counted).
std::uint64_t fp8_backward_measurements() noexcept;

}  // namespace fusedattn
