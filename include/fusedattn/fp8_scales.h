// fusedattn/fp8_scales.h — the scaling tensors of an FP8 attention call (specs whose q, k and v
// are E4M3 or E5M2), as cuDNN's FP8 attention takes them.
//
// Every pointer is a float32 scalar in device memory (read or written by the call's kernels, so
// a captured or replayed call sees each step's new values). The convention is fusedattn/fp8.h's:
// X8 = fp8(X * scale_x), and descale_x = 1 / scale_x. S is the softmax's probabilities, which the
// kernels quantize inside with scale_s before multiplying by V; dP = dO V^T in the backward. Each
// amax is max |X| of the unscaled tensor, for the caller's scaling recipe to use next. All are
// required for an FP8 spec with per-tensor scaling, refused for an MXFP8 one (fp8_scaling=mxfp8
// takes fusedattn/mxfp8_scales.h's instead) and ignored for a 16-bit one. An FP8 K/V cache beside
// 16-bit queries (AttentionSpec::fp8_kv_cache) takes descale_k and descale_v alone, K ~ K8 *
// descale_k: float32 scalars, or float32 [h_kv] (one a K/V head) with fp8_scaling=head.
// fusedattn/tensor_slots.h lists every field by name and role (a field added here needs a slot there).
#pragma once

namespace fusedattn {

struct Fp8ForwardScales {
  const float* descale_q = nullptr;
  const float* descale_k = nullptr;
  const float* descale_v = nullptr;
  const float* descale_s = nullptr;
  /// The probabilities are at most 1: fp8_max(dtype) uses the format's whole range, and is the
  /// scale to use. A scale from amax_s (the largest normalized probability, far below 1 without a
  /// causal mask) saturates what cuDNN's kernels quantize: O came out with relative errors of 0.96
  /// on the H200 with amax_s around 0.013.
  const float* scale_s = nullptr;
  const float* scale_o = nullptr;  ///< O is written as fp8(O * scale_o)
  float* amax_s = nullptr;
  float* amax_o = nullptr;
};

/// The backward reads q, k, v, o and d_o in FP8 (each with its descale) and writes dQ, dK and dV in
/// FP8 with their scales.
struct Fp8BackwardScales {
  const float* descale_q = nullptr;
  const float* descale_k = nullptr;
  const float* descale_v = nullptr;
  const float* descale_o = nullptr;
  const float* descale_d_o = nullptr;
  const float* descale_s = nullptr;
  const float* descale_d_p = nullptr;
  const float* scale_s = nullptr;
  const float* scale_d_p = nullptr;
  const float* scale_d_q = nullptr;
  const float* scale_d_k = nullptr;
  const float* scale_d_v = nullptr;
  float* amax_d_q = nullptr;
  float* amax_d_k = nullptr;
  float* amax_d_v = nullptr;
  float* amax_d_p = nullptr;
};

}  // namespace fusedattn
