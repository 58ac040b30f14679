// fusedattn/options.h — AttentionOptions: everything a call computes beyond its four tensors.
//
// Masks, score terms, the softmax variant, extra outputs, dropout, runtime lengths, FP8 scaling. The adapters'
// keyword arguments map onto these fields one to one (fusedattn/call.h); AttentionSpec adds the
// tensors. The spec's one field table (spec.cpp) parses, prints, compares and hashes them.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "fusedattn/score_mod.h"

namespace fusedattn {

/// Where the causal diagonal starts: row 0 sees key 0 (top-left), or the last row sees the last
/// key (bottom-right, the usual choice for decoding with a KV cache when s_q < s_kv).
enum class Alignment : std::uint8_t { top_left, bottom_right };

const char* to_string(Alignment alignment) noexcept;

/// Which keys each query sees, around its diagonal position p (p = i top-left, p = i + s_kv - s_q
/// bottom-right): key j is visible when p - left < j <= p + right. A bound of -1 is no bound on
/// that side. {-1, -1} is no mask, {-1, 0} causal, {W, 0} a causal sliding window of W keys
/// (the diagonal included), {W, R} a band that also looks R keys ahead.
struct Window {
  std::int64_t left = -1;
  std::int64_t right = -1;

  bool bounded() const noexcept { return left >= 0 || right >= 0; }
  bool causal() const noexcept { return left < 0 && right == 0; }
  friend bool operator==(const Window& a, const Window& b) noexcept { return a.left == b.left && a.right == b.right; }
  friend bool operator!=(const Window& a, const Window& b) noexcept { return !(a == b); }
};

/// "LEFT,RIGHT", as the spec string writes it ("-1,0" for causal).
std::string to_string(const Window& window);

/// The causal window {-1, 0}.
constexpr Window kCausal{-1, 0};

/// What `causal` means wherever a call can say it (the spec string's `causal`, the adapters'
/// causal=True, the CLI, context parallelism), written once: no key to the right of the diagonal.
/// It closes the window's right side and keeps its left: {-1, -1} becomes {-1, 0} (causal), and
/// {W, -1} and {W, 0} become {W, 0} (a causal sliding window of W keys). A window that looks ahead
/// (a right bound of 1 or more) contradicts it, so it is refused rather than silently cut:
/// InvalidArgument("window", "L,R", ...), as is any other right bound but 0 or -1. The left bound
/// is validate()'s to check. Without causal, a call's window is used as it is.
Window causal_window(const Window& window);

/// Which dims of the post-scale bias [b, h, s_q, s_kv] are real (the others broadcast, size 1).
/// The bias tensor is contiguous in its own shape and has q's dtype; it is added to the scaled
/// scores before the mask and the softmax.
enum class Bias : std::uint8_t { none, bhss, b1ss, one_hss, one_1ss, one_11s };
const char* to_string(Bias bias) noexcept;  ///< "none", "bhss", "b1ss", "1hss", "11ss", "111s"

/// Dims of the bias tensor of `bias` kind for these sizes: [b or 1, h or 1, s_q or 1, s_kv]
/// (all zero for Bias::none).
std::array<std::int64_t, 4> bias_dims(Bias bias, std::int64_t batch, std::int64_t heads, std::int64_t seq_q,
                                      std::int64_t seq_kv) noexcept;

/// The softmax's denominator: vanilla sum_j e^s_ij; off_by_one adds e^0 (a zero logit that takes
/// probability mass); sink adds e^sink_h, a learnable per-head logit (float32 [h], with a gradient).
enum class Softmax : std::uint8_t { vanilla, off_by_one, sink };
const char* to_string(Softmax softmax) noexcept;

/// The largest logit (scaled score after bias and mask) per query row, or reduced to one value per
/// head over the batch and every valid row.
enum class MaxLogit : std::uint8_t { none, row, head };
const char* to_string(MaxLogit max_logit) noexcept;

/// How FP8 q, k, v (and the backward's dO) are scaled: one float32 scale per tensor
/// (fusedattn/fp8_scales.h), or MXFP8, one E8M0 scale per block of 32 elements in cuDNN's 128x4
/// layout (fusedattn/mxfp8.h, the call's tensors in fusedattn/mxfp8_scales.h). Only FP8 inputs take
/// mxfp8, with a 16-bit O, whose dtype the gradients then have too (validate()). An FP8 K/V cache
/// (AttentionSpec::fp8_kv_cache) takes tensor (descale_k and descale_v float32 scalars) or head,
/// one descale per K/V head (float32 [h_kv] each), as caches quantized head by head keep them.
enum class Fp8Scaling : std::uint8_t { tensor, mxfp8, head };
const char* to_string(Fp8Scaling fp8_scaling) noexcept;  ///< "tensor", "mxfp8", "head"

/// The format of an FP8 backward's dO, dP and gradients (dQ, dK, dV): the inputs' own, or E5M2
/// beside E4M3 inputs, the "hybrid" recipe of FP8 training (gradients need range more than
/// precision: E5M2 reaches 57344, E4M3 448). Only E4M3 inputs take e5m2 (validate()).
enum class Fp8Gradients : std::uint8_t { as_inputs, e5m2 };
const char* to_string(Fp8Gradients fp8_gradients) noexcept;  ///< "as_inputs", "e5m2"

/// A call's options, every field at the value that plain attention has.
struct AttentionOptions {
  Window window;                              ///< which keys each query sees (default: all)
  Alignment alignment = Alignment::top_left;  ///< where the diagonal starts (matters only with a bound)
  Bias bias = Bias::none;       ///< a post-scale bias tensor and which of its dims broadcast
  bool bias_grad = false;       ///< backward also writes dBias (in the bias's own shape)
  bool alibi = false;           ///< add ALiBi with the standard per-head slopes (needs a causal window)
  Softmax softmax = Softmax::vanilla;
  MaxLogit max_logit = MaxLogit::none;
  double dropout = 0.0;  ///< probability of dropping each attention probability (Philox, seed and offset
                         ///< read from device memory at run time); 0 = no dropout
  bool dropout_mask_out = false;  ///< forward also writes the keep mask it drew (float32 [b, h_q, s_q,
                                  ///< s_kv], 0 or 1), for checking and debugging
  bool padding = false;  ///< per-batch lengths come at run time (seq_len_q, seq_len_kv in the tensor
                         ///< sets); rows and keys past them are padding, and O, dQ, dK, dV are zero there
  bool deterministic = false;  ///< backward: bitwise-reproducible dQ, dK, dV (no atomic accumulation)
  bool stats = true;  ///< also write the softmax statistics (log-sum-exp, float32 [b, h_q, s_q, 1]),
                      ///< which the backward pass needs; inference may turn them off
  std::int64_t kv_pages = 0;  ///< > 0: K and V are paged caches, k and v describe their pools of
                              ///< pages [pages, h_kv, page_size, d], and each sequence has kv_pages
                              ///< pages in its page table (layout.h paged_kv); 0: not paged
  Fp8Scaling fp8_scaling = Fp8Scaling::tensor;  ///< FP8 inputs: per-tensor or MXFP8 block scales
  Fp8Gradients fp8_gradients = Fp8Gradients::as_inputs;  ///< FP8 backward: the format of dO and the gradients
  ScoreMod score_mod;  ///< an element-wise expression applied to each scaled score (score_mod.h);
                       ///< empty: none. Its runtime scalars' values do not belong to the spec
};

}  // namespace fusedattn
