// testing/attention_buffers.h — device memory for every tensor of one spec, filled and poisoned
// the same way by the CLI, the GPU tests and the benchmarks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusedattn/attention.h"
#include "testing/device_buffer.h"

namespace fusedattn::check {

/// Elements of the statistics (and of a per-row max logit): b * h_q * s_q.
std::int64_t stats_elements(const AttentionSpec& spec);
/// Elements of the dropout keep mask: b * h_q * s_q * s_kv.
std::size_t mask_elements(const AttentionSpec& spec);
/// Elements of the max logit: h_q per head, else one per row.
std::size_t max_logit_elements(const AttentionSpec& spec);

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
  /// each entry's lengths from the same generator. Synchronous.
  void fill_inputs(std::uint64_t seed);
  /// Sets each entry's lengths (spec.padding) and copies them to the device. Synchronous.
  void set_lengths(const std::vector<std::int32_t>& seq_len_q, const std::vector<std::int32_t>& seq_len_kv);
  /// The lengths in use (empty without padding).
  const std::vector<std::int32_t>& seq_len_q() const noexcept;
  const std::vector<std::int32_t>& seq_len_kv() const noexcept;
  /// Writes dropout's seed and offset (int64, device) for the next calls; fill_inputs draws fresh
  /// ones. Synchronous.
  void set_dropout_state(std::int64_t seed, std::int64_t offset);
  /// A score modifier's values (spec.score_mod): fill_inputs draws its scalars uniformly from
  /// [0.5, 2] and its tensors from [-1, 1]; set_score_mod_scalars replaces the scalars. Synchronous.
  void set_score_mod_scalars(const std::vector<float>& scalars);
  const std::vector<float>& score_mod_scalars() const noexcept;
  const std::vector<std::vector<float>>& score_mod_tensors() const noexcept;
  /// The sink logits drawn by fill_inputs (Softmax::sink), empty otherwise.
  const std::vector<float>& sink() const noexcept;
  /// Sets every byte of O, stats and the gradient buffers to 0xFF, which is NaN in bf16, f16 and
  /// float32, so any element a kernel forgets to write shows up as an error.
  void poison_outputs();

  /// The device pointers of the spec's forward / backward call (gradients null without backward).
  ForwardTensors forward_tensors() const;
  BackwardTensors backward_tensors() const;

  /// Host copy of an input buffer as generated (for the CPU reference): the tensor's first element
  /// is at the returned pointer. Valid after fill_inputs(). `which` is "q", "k", "v", "do" or "bias".
  const std::uint16_t* host_input(const std::string& which) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace fusedattn::check
