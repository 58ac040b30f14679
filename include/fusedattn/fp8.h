// fusedattn/fp8.h — FP8 values and per-tensor scaling: host codecs, and the device kernels that
// quantize 16-bit tensors into FP8 (and back) and measure or update their scales.
//
// Conventions (those of FP8 training as Transformer Engine and cuDNN use them): a tensor X is held
// as X8 = fp8(X * scale), and descale = 1 / scale turns it back: X ~ X8 * descale. Every scale,
// descale and amax ("absolute maximum", max |X| over the tensor) is a float32 scalar in device
// memory, so CUDA graphs and replays see new values without being rebuilt. Conversions to FP8 round
// to nearest, ties to even, and saturate: a finite value past the largest finite FP8 value (and an
// infinity) becomes that value with its sign; NaN stays NaN.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fusedattn/tensor.h"

namespace fusedattn {

/// Largest finite value of an FP8 type: 448 (E4M3), 57344 (E5M2); 0 for other types.
float fp8_max(DType dtype) noexcept;

/// Host codecs for one FP8 value of `dtype` (E4M3 or E5M2), as the device kernels convert.
float fp8_bits_to_float(std::uint8_t bits, DType dtype) noexcept;
std::uint8_t float_to_fp8_bits(float value, DType dtype) noexcept;

// --- device kernels (enqueued on `stream`; tensors of any strides; pointers on the device) ------
// Each checks its inputs first and throws InvalidArgument, enqueuing nothing, for a wrong dtype,
// mismatched dims, a null pointer, or a ragged tensor (batch stride 0: its run-time offsets are
// not taken here, so pass the packed tokens as one dense entry [1, h, tokens, d]).

/// *amax = max |x| over the tensor (NaN if any element is NaN); 0 for an empty tensor. Any dtype;
/// for an FP8 tensor, of its stored values (before any descale).
void measure_amax(const TensorDesc& desc, const void* data, float* amax, cudaStream_t stream);

/// One tensor of measure_amax_many: measure_amax's arguments.
struct Fp8Amax {
  TensorDesc desc;
  const void* data = nullptr;
  float* amax = nullptr;
};

/// measure_amax of `count` tensors (Q, K and V of a forward under current scaling), checked first
/// (a field of tensors[i] is named so); dense tensors of one dtype share a launch, and amaxes at
/// consecutive addresses are zeroed by one memset.
void measure_amax_many(const Fp8Amax* tensors, int count, cudaStream_t stream);

/// One pass: dst = fp8(src * *scale), src a 16-bit tensor and dst an FP8 one of the same dims (any
/// strides each). When `amax` is not null it also gets max |src| (delayed scaling records the
/// amax of what it quantized).
void quantize_fp8(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                  const float* scale, float* amax, cudaStream_t stream);

/// One pass: dst = src * *descale, src an FP8 tensor and dst a 16-bit tensor of
/// the same dims.
void dequantize_fp8(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                    const float* descale, cudaStream_t stream);

/// One tensor of quantize_fp8_many: quantize_fp8's arguments.
struct Fp8Quantization {
  TensorDesc src_desc;
  const void* src = nullptr;
  TensorDesc dst_desc;
  void* dst = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;  ///< may be null
};

/// quantize_fp8 of `count` tensors (Q, K and V of a forward; dO of a backward beside them): every
/// one is checked before anything is enqueued (a field of tensors[i] is named so), and those of one
/// dtype pair whose source and destination share rows of consecutive elements (dense tensors in one
/// axis order, allocated like their inputs) run in one launch.
void quantize_fp8_many(const Fp8Quantization* tensors, int count, cudaStream_t stream);

/// One tensor of dequantize_fp8_many: dequantize_fp8's arguments.
struct Fp8Dequantization {
  TensorDesc src_desc;
  const void* src = nullptr;
  TensorDesc dst_desc;
  void* dst = nullptr;
  const float* descale = nullptr;
};

/// dequantize_fp8 of `count` tensors (dQ, dK and dV of a backward), as quantize_fp8_many.
void dequantize_fp8_many(const Fp8Dequantization* tensors, int count, cudaStream_t stream);

/// Current scaling: *scale = fp8_max(dtype) / (*amax * 2^margin) and *descale = 1 / *scale, with
/// scale 1 where the amax is 0 or not finite (nothing to scale; NaN is left for the data to show).
/// A scale past float's range (a tiny amax, a large margin) is clamped to [FLT_MIN, FLT_MAX], so
/// that the descale stays finite and non-zero.
void scale_from_amax(const float* amax, DType dtype, int margin, float* scale, float* descale, cudaStream_t stream);

/// Delayed scaling's step: `history` (float32 [length], slot 0 the newest) shifts by one slot and
/// takes *amax in slot 0; then *scale and *descale are set as by scale_from_amax from the largest
/// amax in the history (NaN if any is NaN, which gives scale 1). `history_out` may be `history_in`
/// (in place) or a disjoint buffer (functional state, as JAX keeps it); length must be at least 1.
void update_delayed_scaling(const float* history_in, float* history_out, std::int64_t length, const float* amax,
                            DType dtype, int margin, float* scale, float* descale, cudaStream_t stream);

/// How one update of update_fp8_scales sets its scale and descale.
enum class Fp8ScaleRule : std::uint8_t {
  from_amax,  ///< current scaling from *amax, as scale_from_amax
  delayed,    ///< delayed scaling's step: the history takes *amax, as update_delayed_scaling
  keep,       ///< left as they are (the update only reports its descale in descale_used)
};

/// One update of update_fp8_scales: the arguments of scale_from_amax or update_delayed_scaling,
/// by `rule`, and where to report the descale it replaces.
struct Fp8ScaleUpdate {
  Fp8ScaleRule rule = Fp8ScaleRule::from_amax;
  const float* amax = nullptr;          ///< not read by keep
  const float* history_in = nullptr;    ///< delayed only: float32 [length], slot 0 the newest
  float* history_out = nullptr;         ///< delayed only: history_in (in place) or a disjoint buffer
  std::int64_t length = 0;              ///< delayed only: at least 1
  DType dtype = DType::e4m3;            ///< the FP8 type the scale is for
  int margin = 0;
  float* scale = nullptr;
  float* descale = nullptr;
  float* descale_used = nullptr;        ///< where not null, gets *descale as it was before this update
};

/// A recipe's scale updates of one step, in one launch and in order: an update may read an amax
/// or a descale that an earlier one wrote (O's scale from V's amax after V's own update). Every
/// update is checked first (a field of updates[i] is named so), and nothing is enqueued for a
/// bad one. At most kMaxScaleUpdates per call.
constexpr int kMaxScaleUpdates = 16;
void update_fp8_scales(const Fp8ScaleUpdate* updates, int count, cudaStream_t stream);

}  // namespace fusedattn
