// When a backward runs grouped K/V heads as separate heads, and the spec and workspace it then uses.
#include "support/kv_expansion.h"

namespace fusedattn::detail {
namespace {

constexpr std::size_t kAlignment = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// [b, s, h, d] contiguous, in the [b, h, s, d] order of TensorDesc.
TensorDesc with_heads(const TensorDesc& desc, std::int64_t heads) {
  TensorDesc out = desc;
  out.dims[kHead] = heads;
  const std::int64_t d = desc.dims[kDim];
  out.strides = {desc.dims[kSeq] * heads * d, d, heads * d, 1};
  return out;
}

}  // namespace

bool in_16_byte_rows(const TensorDesc& desc) noexcept {
  const std::int64_t size = static_cast<std::int64_t>(size_of(desc.dtype));
  if ((desc.head_dim() * size) % 16 != 0) return false;
  for (int axis : {kBatch, kHead, kSeq}) {
    if ((desc.strides[axis] * size) % 16 != 0) return false;
  }
  return true;
}

bool expands_kv_heads(const AttentionSpec& spec, Pass pass, int multiprocessors) noexcept {
  if (pass != Pass::backward || !is_fp8(spec.q.dtype) || spec.heads_q() <= spec.heads_kv()) return false;
  if (spec.fp8_scaling == Fp8Scaling::mxfp8) return false;
  // Padding stays grouped: rows past a length may be left unwritten in the ungrouped dK, dV, and
  // the sums (and their amaxes) would read them.
  if (spec.padding || spec.ragged_q() || spec.ragged_kv() || spec.paged_kv() || multiprocessors <= 0) return false;
  if (!in_16_byte_rows(spec.k) || !in_16_byte_rows(spec.v)) return false;
  const std::int64_t tiles =
      spec.batch() * spec.heads_kv() * ((spec.seq_kv() + kExpansionKeyTile - 1) / kExpansionKeyTile);
  return tiles < kExpansionMinWaves * multiprocessors;
}

AttentionSpec kv_expanded_spec(const AttentionSpec& spec) {
  AttentionSpec out = spec;
  out.k = with_heads(spec.k, spec.heads_q());
  out.v = with_heads(spec.v, spec.heads_q());
  return out;
}

KvExpansionLayout kv_expansion_layout(const AttentionSpec& spec) {
  const AttentionSpec expanded = kv_expanded_spec(spec);
  const std::size_t k_bytes = aligned(static_cast<std::size_t>(expanded.k.elements()) * size_of(spec.k.dtype));
  const std::size_t v_bytes = aligned(static_cast<std::size_t>(expanded.v.elements()) * size_of(spec.v.dtype));
  KvExpansionLayout layout;
  layout.k = 0;
  layout.v = layout.k + k_bytes;
  layout.d_k = layout.v + v_bytes;
  layout.d_v = layout.d_k + k_bytes;
  layout.amax_d_k = layout.d_v + v_bytes;
  layout.amax_d_v = layout.amax_d_k + sizeof(float);
  layout.bytes = aligned(layout.amax_d_v + sizeof(float));
  return layout;
}

}  // namespace fusedattn::detail
