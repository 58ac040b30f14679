// fusedattn/reference.h — attention references that do not use cuDNN, to check it against.
//
// Two references compute the same function: a CPU one in float64 for small shapes, and a simple
// float32 GPU one (plain CUDA kernels, no tensor cores) for shapes too large for the CPU. Both
// work on contiguous [b, h, s, d] arrays; gather/scatter helpers convert from any spec layout.
//
// Rows that see no key at all (say, bottom-right causal with s_q > s_kv) are defined as O = 0 with
// log-sum-exp = -infinity, and contribute no gradient.
//
// Padding: each batch entry b may use only its first seq_len_q[b] query rows and seq_len_kv[b] keys.
// Query rows i >= seq_len_q[b] are padding: O = 0, lse = -infinity and dQ = 0 there. Keys
// j >= seq_len_kv[b] are never visible, so dK = dV = 0 there. The window (spec.h) uses the entry's
// actual lengths: bottom-right puts the diagonal at p = i + seq_len_kv[b] - seq_len_q[b], so that an
// entry computes exactly what it would alone, unpadded. A row that then sees no key (a zero-length
// KV, or the window) is O = 0, lse = -infinity, as above.
//
// Dropout (p = ReferenceProblem::dropout > 0) is not drawn here: the reference takes an explicit keep
// mask M [b, h_q, s_q, s_kv] (1 = kept, 0 = dropped; say, the one cuDNN dumped) and reproduces exactly
// that dropout. With P the softmax probabilities (every other feature included),
//   Pd_ij = P_ij * M_ij / (1 - p),   O_i = sum_j Pd_ij V_j,
// while lse and the max logit come from P and do not see the dropout. The backward of L = sum(O ∘ dO):
//   dV_j = sum_i Pd_ij dO_i,   dP_ij = dO_i . V_j,   D_i = dO_i . O_i  (O with dropout),
//   dS_ij = P_ij (dP_ij M_ij / (1 - p) - D_i),
// and dQ, dK, dBias from dS as without dropout; dSink_h = -sum_i e^(sink_h - lse_i) D_i, with this D.
// M is read only where row i sees key j (elsewhere P = 0 and M may hold anything).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "fusedattn/spec.h"

namespace fusedattn {

/// Sizes and options of a reference computation.
struct ReferenceProblem {
  std::int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 1, seq_kv = 1, head_dim_qk = 64, head_dim_v = 64;
  Window window;  ///< which keys each query sees (see spec.h)
  Alignment alignment = Alignment::top_left;
  double scale = 0.125;
  /// Actual lengths per batch entry (padding), each in [0, seq_q] / [0, seq_kv]; empty means every
  /// entry uses the full seq_q / seq_kv. Both empty or both of size batch.
  std::vector<std::int64_t> seq_len_q, seq_len_kv;
  Bias bias = Bias::none;              ///< a bias is added to the scaled scores (values in ReferenceExtras)
  bool alibi = false;                  ///< adds alibi_slopes(h_q)[h] * (j - i) to the scaled scores
  Softmax softmax = Softmax::vanilla;  ///< off_by_one / sink add e^0 / e^sink[h] to the denominator
  double dropout = 0.0;                ///< probability of dropping a probability; 0 = none (mask in extras)
  /// A score modifier (score_mod.h), applied to each scaled score before the bias and ALiBi, with
  /// its runtime scalars and its tensors (host memory, each contiguous over its axes). Only the CPU
  /// reference applies one; the backward multiplies dS by the modifier's derivative.
  ScoreMod score_mod;
  std::vector<float> score_mod_scalars;
  std::vector<std::vector<float>> score_mod_tensors;
};

/// Optional inputs and outputs of a reference call, contiguous, in the call's precision. What the
/// problem asks for must be there: `bias` ([b|1, h_q|1, s_q|1, s_kv], see bias_dims) when
/// p.bias != none, `sink` ([h_q]) when p.softmax == sink, `dropout_mask` ([b, h_q, s_q, s_kv]) when
/// p.dropout > 0. Outputs are written when not null: `max_logit` [b, h_q, s_q] (forward; the largest
/// visible logit of each row, -inf for rows that see nothing or are padding), `d_bias` (backward,
/// in the bias's shape, summed over the broadcast dims), `d_sink` [h_q] (backward).
template <class T>
struct ReferenceExtras {
  const T* bias = nullptr;
  const T* sink = nullptr;
  /// Dropout keep mask [b, h_q, s_q, s_kv], contiguous, each 0 or 1 (1 = kept); required when
  /// p.dropout > 0, ignored when p.dropout == 0. Read only where a row sees the key.
  const T* dropout_mask = nullptr;
  T* max_logit = nullptr;
  T* d_bias = nullptr;
  T* d_sink = nullptr;
};

/// bias_dims(...), declared in spec.h, gives the bias's shape for a problem's sizes.

/// The standard ALiBi slopes for `heads` heads (powers 2^(-8k/n), interleaved for head counts that
/// are not powers of two), as cuDNN computes them.
std::vector<double> alibi_slopes(std::int64_t heads);

/// The spec's sizes, mask and score modifier, without padding: lengths and the modifier's values are
/// runtime data, which callers set.
ReferenceProblem reference_problem(const AttentionSpec& spec, double scale);

/// True when query row i of batch entry b may see key column j under the problem's mask and that
/// entry's lengths (false for padding rows and keys). b must be below p.batch.
bool reference_visible(const ReferenceProblem& p, std::int64_t b, std::int64_t i, std::int64_t j) noexcept;

// --- CPU, float64 ---------------------------------------------------------------------------

/// o: [b, h_q, s_q, d_v]; lse: [b, h_q, s_q] (natural log-sum-exp of the scaled scores).
void reference_forward_cpu(const ReferenceProblem& p, const double* q, const double* k, const double* v,
                           double* o, double* lse, const ReferenceExtras<double>& extras = {});

/// Gradients of sum(O * dO) with respect to Q, K and V, recomputing the forward itself.
/// d_k and d_v sum over the query heads that share each key/value head (GQA/MQA).
void reference_backward_cpu(const ReferenceProblem& p, const double* q, const double* k, const double* v,
                            const double* d_o, double* d_q, double* d_k, double* d_v,
                            const ReferenceExtras<double>& extras = {});

// --- GPU, float32 (device pointers, enqueued on `stream`) -----------------------------------

void reference_forward_gpu(const ReferenceProblem& p, const float* q, const float* k, const float* v, float* o,
                           float* lse, cudaStream_t stream, const ReferenceExtras<float>& extras = {});
/// Needs the forward's o and lse (from reference_forward_gpu).
void reference_backward_gpu(const ReferenceProblem& p, const float* q, const float* k, const float* v,
                            const float* o, const float* lse, const float* d_o, float* d_q, float* d_k, float* d_v,
                            cudaStream_t stream, const ReferenceExtras<float>& extras = {});

/// Copies a device tensor of any layout and dtype into a contiguous float32 [b, h, s, d] buffer.
void gather_to_float_gpu(const TensorDesc& desc, const void* src, float* dst, cudaStream_t stream);
/// Writes a contiguous float32 [b, h, s, d] device buffer into a tensor of `desc`'s layout and dtype.
void scatter_from_float_gpu(const TensorDesc& desc, const float* src, void* dst, cudaStream_t stream);

// --- Host helpers ---------------------------------------------------------------------------

/// Converts one 16-bit value of `dtype` to float and back (round to nearest even).
float half_bits_to_float(std::uint16_t bits, DType dtype) noexcept;
std::uint16_t float_to_half_bits(float value, DType dtype) noexcept;

/// Host copies between a strided 16-bit buffer (`desc`, base at element 0) and contiguous doubles.
std::vector<double> gather_to_double(const TensorDesc& desc, const std::uint16_t* src);
void scatter_from_double(const TensorDesc& desc, const double* src, std::uint16_t* dst);

/// ||out - ref|| / ||ref|| over n values; +infinity if any value of out is NaN or infinite where
/// ref is finite, so NaN never passes a tolerance. Returns ||out|| when ||ref|| is 0.
template <class A, class B>
double relative_error(const A* out, const B* ref, std::int64_t n);

extern template double relative_error<double, double>(const double*, const double*, std::int64_t);
extern template double relative_error<float, float>(const float*, const float*, std::int64_t);
extern template double relative_error<float, double>(const float*, const double*, std::int64_t);

}  // namespace fusedattn
