// Tensor sets to UID-indexed pointers: one mapping for every caller of a graph.
#include "exec/uid_pointers.h"

namespace fusedattn::detail {
namespace {

void place_score_mod(const ScoreModTensors& t, PointersByUid& p) {
  for (int i = 0; i < kMaxScoreModScalars; ++i) {
    p.at[graph::kUidScoreModScalar0 + i] = t.scalars ? const_cast<float*>(t.scalars + i) : nullptr;
  }
  for (int i = 0; i < kMaxScoreModTensors; ++i) {
    p.at[graph::kUidScoreModTensor0 + i] = const_cast<float*>(t.tensors[static_cast<std::size_t>(i)]);
  }
}

}  // namespace

PointersByUid forward_pointers(const ForwardTensors& t, float* scale) {
  PointersByUid p;
  p.at[graph::kUidQ] = const_cast<void*>(t.q);
  p.at[graph::kUidK] = const_cast<void*>(t.k);
  p.at[graph::kUidV] = const_cast<void*>(t.v);
  p.at[graph::kUidO] = t.o;
  p.at[graph::kUidStats] = t.stats;
  p.at[graph::kUidScale] = scale;
  p.at[graph::kUidSeqLenQ] = const_cast<std::int32_t*>(t.seq_len_q);
  p.at[graph::kUidSeqLenKV] = const_cast<std::int32_t*>(t.seq_len_kv);
  p.at[graph::kUidScoreModSeqLenQ] = p.at[graph::kUidSeqLenQ];
  p.at[graph::kUidScoreModSeqLenKV] = p.at[graph::kUidSeqLenKV];
  p.at[graph::kUidBias] = const_cast<void*>(t.bias);
  p.at[graph::kUidSink] = const_cast<float*>(t.sink);
  p.at[graph::kUidMaxLogit] = t.max_logit;
  p.at[graph::kUidSumExp] = t.stats;  // with a max logit, the sums arrive where the statistics go
  p.at[graph::kUidDropoutSeed] = const_cast<std::int64_t*>(t.dropout_seed);
  p.at[graph::kUidDropoutOffset] = const_cast<std::int64_t*>(t.dropout_offset);
  p.at[graph::kUidDropoutMask] = t.dropout_mask;
  p.at[graph::kUidPageTableK] = const_cast<std::int32_t*>(t.page_table_k);
  p.at[graph::kUidPageTableV] = const_cast<std::int32_t*>(t.page_table_v);
  p.at[graph::kUidDescaleQ] = const_cast<float*>(t.fp8.descale_q);
  p.at[graph::kUidDescaleK] = const_cast<float*>(t.fp8.descale_k);
  p.at[graph::kUidDescaleV] = const_cast<float*>(t.fp8.descale_v);
  p.at[graph::kUidDescaleS] = const_cast<float*>(t.fp8.descale_s);
  p.at[graph::kUidScaleS] = const_cast<float*>(t.fp8.scale_s);
  p.at[graph::kUidScaleO] = const_cast<float*>(t.fp8.scale_o);
  p.at[graph::kUidAmaxS] = t.fp8.amax_s;
  p.at[graph::kUidAmaxO] = t.fp8.amax_o;
  const Mxfp8ForwardTensors& m = t.mxfp8;
  p.at[graph::kUidSfQ] = const_cast<std::uint8_t*>(m.sf_q);
  p.at[graph::kUidSfK] = const_cast<std::uint8_t*>(m.sf_k);
  p.at[graph::kUidSfV] = const_cast<std::uint8_t*>(m.sf_v);
  p.at[graph::kUidMxfp8AmaxO] = m.amax_o;
  place_score_mod(t.score_mod, p);
  return p;
}

PointersByUid backward_pointers(const BackwardTensors& t, float* scale) {
  PointersByUid p;
  p.at[graph::kUidQ] = const_cast<void*>(t.q);
  p.at[graph::kUidK] = const_cast<void*>(t.k);
  p.at[graph::kUidV] = const_cast<void*>(t.v);
  p.at[graph::kUidO] = const_cast<void*>(t.o);
  p.at[graph::kUidDO] = const_cast<void*>(t.d_o);
  p.at[graph::kUidStats] = const_cast<float*>(t.stats);
  p.at[graph::kUidDQ] = t.d_q;
  p.at[graph::kUidDK] = t.d_k;
  p.at[graph::kUidDV] = t.d_v;
  p.at[graph::kUidScale] = scale;
  p.at[graph::kUidSeqLenQ] = const_cast<std::int32_t*>(t.seq_len_q);
  p.at[graph::kUidSeqLenKV] = const_cast<std::int32_t*>(t.seq_len_kv);
  p.at[graph::kUidScoreModSeqLenQ] = p.at[graph::kUidSeqLenQ];
  p.at[graph::kUidScoreModSeqLenKV] = p.at[graph::kUidSeqLenKV];
  p.at[graph::kUidBias] = const_cast<void*>(t.bias);
  p.at[graph::kUidSink] = const_cast<float*>(t.sink);
  p.at[graph::kUidDBias] = t.d_bias;
  p.at[graph::kUidDSink] = t.d_sink;
  p.at[graph::kUidDropoutSeed] = const_cast<std::int64_t*>(t.dropout_seed);
  p.at[graph::kUidDropoutOffset] = const_cast<std::int64_t*>(t.dropout_offset);
  const Fp8BackwardScales& f = t.fp8;
  p.at[graph::kUidDescaleQ] = const_cast<float*>(f.descale_q);
  p.at[graph::kUidDescaleK] = const_cast<float*>(f.descale_k);
  p.at[graph::kUidDescaleV] = const_cast<float*>(f.descale_v);
  p.at[graph::kUidDescaleO] = const_cast<float*>(f.descale_o);
  p.at[graph::kUidDescaleDO] = const_cast<float*>(f.descale_d_o);
  p.at[graph::kUidDescaleS] = const_cast<float*>(f.descale_s);
  p.at[graph::kUidDescaleDP] = const_cast<float*>(f.descale_d_p);
  p.at[graph::kUidScaleS] = const_cast<float*>(f.scale_s);
  p.at[graph::kUidScaleDP] = const_cast<float*>(f.scale_d_p);
  p.at[graph::kUidScaleDQ] = const_cast<float*>(f.scale_d_q);
  p.at[graph::kUidScaleDK] = const_cast<float*>(f.scale_d_k);
  p.at[graph::kUidScaleDV] = const_cast<float*>(f.scale_d_v);
  p.at[graph::kUidAmaxDQ] = f.amax_d_q;
  p.at[graph::kUidAmaxDK] = f.amax_d_k;
  p.at[graph::kUidAmaxDV] = f.amax_d_v;
  p.at[graph::kUidAmaxDP] = f.amax_d_p;
  const Mxfp8BackwardTensors& m = t.mxfp8;
  p.at[graph::kUidQT] = const_cast<void*>(m.q_t);
  p.at[graph::kUidKT] = const_cast<void*>(m.k_t);
  p.at[graph::kUidDOFp8] = const_cast<void*>(m.d_o);
  p.at[graph::kUidDOT] = const_cast<void*>(m.d_o_t);
  p.at[graph::kUidSfQ] = const_cast<std::uint8_t*>(m.sf_q);
  p.at[graph::kUidSfQT] = const_cast<std::uint8_t*>(m.sf_q_t);
  p.at[graph::kUidSfK] = const_cast<std::uint8_t*>(m.sf_k);
  p.at[graph::kUidSfKT] = const_cast<std::uint8_t*>(m.sf_k_t);
  p.at[graph::kUidSfV] = const_cast<std::uint8_t*>(m.sf_v);
  p.at[graph::kUidSfDO] = const_cast<std::uint8_t*>(m.sf_d_o);
  p.at[graph::kUidSfDOT] = const_cast<std::uint8_t*>(m.sf_d_o_t);
  p.at[graph::kUidMxfp8AmaxDQ] = m.amax_d_q;
  p.at[graph::kUidMxfp8AmaxDK] = m.amax_d_k;
  p.at[graph::kUidMxfp8AmaxDV] = m.amax_d_v;
  place_score_mod(t.score_mod, p);
  return p;
}

}  // namespace fusedattn::detail
