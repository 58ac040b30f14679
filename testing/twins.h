// testing/twins.h — ragged and paged specs checked through their dense twins: the twin's buffers
// and references are the dense ones, and the ragged or paged call is laid over them.
#pragma once

#include <cstdint>
#include <vector>

#include "fusedattn/attention.h"
#include "testing/attention_buffers.h"
#include "testing/device_buffer.h"

namespace fusedattn::check {

/// The dense twin of a ragged spec: each ragged tensor with its sequences in full-length slots
/// (batch stride s * token stride). A ragged spec is checked through it: buffers, references and
/// comparisons are the dense ones, the call is ragged with sequence b starting at token b * s, so
/// the rows past each length are the gaps between sequences. Dense specs come back unchanged.
AttentionSpec ragged_twin(AttentionSpec spec);

/// The dense twin of a paged spec: K and V as [b, h_kv, s_kv, d] in their pages' format (bshd or
/// sbhd). A paged spec is checked through it: the check copies each sequence's pages into the
/// pools at shuffled pages, runs the paged call, and compares with the dense reference.
AttentionSpec paged_twin(AttentionSpec spec);

/// Adjusts the lengths `buffers` drew for the twin of the ragged spec `ragged`: packed Q/K/V
/// tokens (t3hd, th3d) make each sequence's Q and KV lengths one, and from three sequences on, the
/// second one is empty (0 and 0), so empty sequences are always exercised. Synchronous.
void set_ragged_lengths(const AttentionSpec& ragged, AttentionBuffers& buffers);

/// Ragged statistics are token-major, [b, s_q, h_q] in the twin's slots: the same values as
/// [b, h_q, s_q], the dense order the references write.
std::vector<float> statistics_by_head(const std::vector<float>& by_token, const AttentionSpec& twin);

/// A ragged call over the dense twin's buffers: sequence b has the lengths `buffers` holds and
/// starts at b * s, its slot in the twin, so the rows past its length are the gaps between
/// sequences. Owns the offsets it uploads.
struct RaggedTwinCall {
  DeviceBuffer cu_q, cu_kv, start_q, start_kv;
  RaggedTensors tensors;  ///< what the ragged call passes in its tensor sets

  RaggedTwinCall(const AttentionSpec& twin, const AttentionBuffers& buffers);
};

/// A paged call over the dense twin's K and V: each sequence's pages are copied into pools at
/// random pages (a shuffled page table drawn from `seed`, spare pages left unused), so the paged
/// run reads exactly the values the dense reference sees. Throws InvalidArgument when the pool has
/// fewer than b * kv_pages pages.
struct PagedTwinCall {
  DeviceBuffer k_pool, v_pool, table_k, table_v;

  PagedTwinCall(const AttentionSpec& paged, const AttentionSpec& twin, const ForwardTensors& dense, std::uint64_t seed);
};

}  // namespace fusedattn::check
