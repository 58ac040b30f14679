// The graph layer: AttentionSpec -> cuDNN SDPA graph, compiled. With the other files of src/graph/
// (the MXFP8 tensors, the score modifiers' lowering, plan choice), the only code that includes
// cudnn_frontend.h (through frontend_graph.h).
#include "graph/sdpa_graph.h"

#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "fusedattn/errors.h"
#include "graph/frontend_graph.h"
#include "graph/mxfp8_graph.h"
#include "graph/score_mod_lowering.h"
#include "support/cudnn_status.h"

namespace fusedattn::graph {
namespace fe = cudnn_frontend;
namespace {

using detail::describe;
using detail::mark_scalar_output;
using detail::TensorPtr;

fe::DataType_t frontend_type(DType dtype) {
  switch (dtype) {
    case DType::f16: return fe::DataType_t::HALF;
    case DType::bf16: return fe::DataType_t::BFLOAT16;
    case DType::e4m3: return fe::DataType_t::FP8_E4M3;
    case DType::e5m2: return fe::DataType_t::FP8_E5M2;
  }
  return fe::DataType_t::NOT_SET;
}

std::vector<std::int64_t> to_vector(const std::array<std::int64_t, 4>& values) {
  return {values.begin(), values.end()};
}

// A ragged tensor's sequences sit where its offset tensor says; cuDNN still wants a batch stride
// that spans one full sequence (and then uses the offsets instead), so it gets that.
std::vector<std::int64_t> frontend_strides(const TensorDesc& desc) {
  std::vector<std::int64_t> strides = to_vector(desc.strides);
  if (desc.ragged()) strides[kBatch] = desc.dims[kSeq] * desc.strides[kSeq];
  return strides;
}

void mark_output(const TensorPtr& tensor, const char* name, Uid uid, const TensorDesc& desc) {
  tensor->set_output(true)
      .set_name(name)
      .set_uid(uid)
      .set_dim(to_vector(desc.dims))
      .set_stride(frontend_strides(desc))
      .set_data_type(frontend_type(desc.dtype));
}

// Softmax statistics, float32 [b, h_q, s_q, 1]: contiguous for a dense Q; for a ragged Q, ragged
// too, token-major ([T, h_q] in memory, placed by the statistics' offsets).
fe::graph::Tensor_attributes stats_tensor(const AttentionSpec& spec) {
  std::int64_t h = spec.heads_q(), s = spec.seq_q();
  const std::vector<std::int64_t> strides =
      spec.ragged_q() ? std::vector<std::int64_t>{h * s, 1, h, 1} : std::vector<std::int64_t>{h * s, s, 1, 1};
  return fe::graph::Tensor_attributes()
      .set_name("stats")
      .set_uid(kUidStats)
      .set_dim({spec.batch(), h, s, 1})
      .set_stride(strides)
      .set_data_type(fe::DataType_t::FLOAT);
}

// Ragged offsets: int64 [b + 1] element offsets of each sequence's first token, one tensor per
// placement (Q, K, V, O and the statistics); dO, dQ, dK and dV reuse their forward tensor's. The
// statistics' offsets exist only where the graph has ragged statistics (`with_stats`): an
// offsets tensor that nothing uses is dropped by cuDNN, and its pointer would then be one too many.
struct RaggedOffsets {
  TensorPtr q, k, v, o, stats;
};

RaggedOffsets ragged_offsets(fe::graph::Graph& graph, const AttentionSpec& spec, bool with_stats,
                             std::vector<std::int64_t>& uids) {
  RaggedOffsets out;
  auto offsets = [&](const char* name, Uid uid) {
    uids.push_back(uid);
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({spec.batch() + 1, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT64));
  };
  if (spec.ragged_q()) {
    out.q = offsets("offset_q", kUidOffsetQ);
    out.o = offsets("offset_o", kUidOffsetO);
    if (with_stats) out.stats = offsets("offset_stats", kUidOffsetStats);
  }
  if (spec.ragged_kv()) {
    out.k = offsets("offset_k", kUidOffsetK);
    out.v = offsets("offset_v", kUidOffsetV);
  }
  return out;
}

void place(const TensorPtr& tensor, const TensorPtr& offsets) {
  if (offsets) tensor->set_ragged_offset(offsets);
}

// A per-row float32 output [b, h_q, s_q, 1] laid out like the statistics.
TensorPtr row_tensor(fe::graph::Graph& graph, const AttentionSpec& spec, const char* name, Uid uid) {
  auto tensor = graph.tensor(stats_tensor(spec).set_name(name).set_uid(uid));
  tensor->set_output(true);
  return tensor;
}

// The scale is passed by value at execute time, so it is not part of the compiled plan.
TensorPtr scale_tensor(fe::graph::Graph& graph) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name("attn_scale")
                          .set_uid(kUidScale)
                          .set_dim({1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_is_pass_by_value(true)
                          .set_data_type(fe::DataType_t::FLOAT));
}

// FP8's scaling tensors: float32 scalars [1, 1, 1, 1] in device memory (fusedattn/fp8_scales.h).
fe::graph::Tensor_attributes scalar_desc(const char* name, Uid uid) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({1, 1, 1, 1})
      .set_stride({1, 1, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

TensorPtr scalar_input(fe::graph::Graph& graph, const char* name, Uid uid, std::vector<std::int64_t>& uids) {
  uids.push_back(uid);
  return graph.tensor(scalar_desc(name, uid));
}

// Runtime lengths: int32 [b, 1, 1, 1], one per batch entry.
TensorPtr length_tensor(fe::graph::Graph& graph, const AttentionSpec& spec, const char* name, Uid uid) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({spec.batch(), 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_data_type(fe::DataType_t::INT32));
}

struct Lengths {
  TensorPtr q, kv;  // a score modifier's padding mask reads these; null without one or without padding
};

// Padding: cuDNN masks keys past seq_len_kv[b] and ignores queries past seq_len_q[b], and a
// bottom-right diagonal follows each entry's actual lengths. Beside a score modifier cuDNN switches
// its padding mask off: the modifier's lowering writes the mask in, reading the lengths it returns.
template <class Attributes>
Lengths apply_padding(fe::graph::Graph& graph, Attributes& attributes, const AttentionSpec& spec,
                      std::vector<std::int64_t>& uids) {
  if (!spec.padding) return {};
  const bool node_takes_lengths = spec.score_mod.empty() || spec.ragged_q() || spec.ragged_kv();
  if (node_takes_lengths) {
    attributes.set_seq_len_q(length_tensor(graph, spec, "seq_len_q", kUidSeqLenQ))
        .set_seq_len_kv(length_tensor(graph, spec, "seq_len_kv", kUidSeqLenKV));
    uids.push_back(kUidSeqLenQ);
    uids.push_back(kUidSeqLenKV);
  }
  if (spec.score_mod.empty()) {
    attributes.set_padding_mask(true);
    return {};
  }
  // Beside a modifier the lengths reach cuDNN's node only where ragged tensors need them (given to
  // a dense node without its padding mask, cuDNN 9.19 computes wrong rows), and the mask written
  // into the modifier reads them as [b, h_q, s_q, s_kv] with stride 0 past the batch: cuDNN 9.19
  // misreads a [b, 1, 1, 1] tensor there (both measured on the H200).
  auto expanded = [&](const char* name, Uid uid) {
    uids.push_back(uid);
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({spec.batch(), spec.heads_q(), spec.seq_q(), spec.seq_kv()})
                            .set_stride({1, 0, 0, 0})
                            .set_data_type(fe::DataType_t::INT32));
  };
  return Lengths{expanded("score_mod_seq_len_q", kUidScoreModSeqLenQ),
                 expanded("score_mod_seq_len_kv", kUidScoreModSeqLenKV)};
}

// Per-head float32 [1, h_q, 1, 1] tensors: the sink logits and their gradient.
fe::graph::Tensor_attributes per_head(const AttentionSpec& spec, const char* name, Uid uid) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({1, spec.heads_q(), 1, 1})
      .set_stride({spec.heads_q(), 1, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

// What the scores get on top of scale·QK^T, and the softmax's extra term. off_by_one is a sink
// whose logits are all zero: the execution layer supplies that zero tensor. The backward needs
// the sink only for its gradient (the statistics already hold its share), and cuDNN drops an
// input it does not use from the graph, so the backward of off_by_one takes no sink.
template <class Attributes>
void apply_score_terms(fe::graph::Graph& graph, Attributes& attributes, const AttentionSpec& spec, Pass pass,
                       std::vector<std::int64_t>& uids) {
  if (spec.bias != Bias::none) {
    attributes.set_bias(graph.tensor(describe("bias", kUidBias, bias_desc(spec))));
    uids.push_back(kUidBias);
  }
  if (spec.alibi) attributes.set_alibi_mask(true);
  const bool takes_sink = pass == Pass::forward ? spec.softmax != Softmax::vanilla : spec.softmax == Softmax::sink;
  if (takes_sink) {
    attributes.set_sink_token(graph.tensor(per_head(spec, "sink", kUidSink)));
    uids.push_back(kUidSink);
  }
}

// Dropout draws from Philox with a seed and an offset read from device memory (int64 [1, 1, 1, 1])
// at run time, so replays of a captured graph use whatever the caller has advanced them to. The
// backward regenerates the forward's mask from the same seed and offset.
template <class Attributes>
void apply_dropout(fe::graph::Graph& graph, Attributes& attributes, const AttentionSpec& spec,
                   std::vector<std::int64_t>& uids) {
  if (spec.dropout == 0.0) return;
  auto scalar = [&](const char* name, Uid uid) {
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({1, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT64));
  };
  attributes.set_dropout(static_cast<float>(spec.dropout), scalar("dropout_seed", kUidDropoutSeed),
                         scalar("dropout_offset", kUidDropoutOffset));
  uids.push_back(kUidDropoutSeed);
  uids.push_back(kUidDropoutOffset);
}

// Paged caches: k and v are pools of pages, and int32 page tables [b, 1, kv_pages, 1] give each
// sequence's pages in order; cuDNN gathers them, up to the spec's longest KV sequence.
void apply_paging(fe::graph::Graph& graph, fe::graph::SDPA_attributes& attributes, const AttentionSpec& spec,
                  std::vector<std::int64_t>& uids) {
  if (!spec.paged_kv()) return;
  auto table = [&](const char* name, Uid uid) {
    uids.push_back(uid);
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({spec.batch(), 1, spec.kv_pages, 1})
                            .set_stride({spec.kv_pages, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT32));
  };
  attributes.set_paged_attention_k_table(table("page_table_k", kUidPageTableK))
      .set_paged_attention_v_table(table("page_table_v", kUidPageTableV))
      .set_paged_attention_max_seq_len_kv(static_cast<int>(spec.seq_kv()));
}

// The window becomes cuDNN's diagonal band: the same "p - left < j <= p + right" (spec.h). Beside
// a score modifier, which switches cuDNN's band off, the modifier's lowering writes it in.
template <class Attributes>
void apply_window(Attributes& attributes, const AttentionSpec& spec) {
  if (!spec.window.bounded() || !spec.score_mod.empty()) return;
  attributes.set_diagonal_alignment(spec.alignment == Alignment::bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                                             : fe::DiagonalAlignment_t::TOP_LEFT);
  if (spec.window.left >= 0) attributes.set_diagonal_band_left_bound(static_cast<int>(spec.window.left));
  if (spec.window.right >= 0) attributes.set_diagonal_band_right_bound(static_cast<int>(spec.window.right));
}

// Tensor `slot` of the modifier: float32, contiguous in its dims (size 1, broadcast, along the axes
// it does not span), except where cuDNN 9.19 misreads such a tensor (both measured on the H200):
// one along the keys but not the queries gets the full query dim with stride 0 (its backward read
// the size-1 dim wrongly), and one along the batch its full sizes with stride 0 past the batch.
fe::graph::Tensor_attributes score_mod_tensor(const AttentionSpec& spec, int slot) {
  const ScoreMod& mod = spec.score_mod;
  const std::array<std::int64_t, 4> sizes = {spec.batch(), spec.heads_q(), spec.seq_q(), spec.seq_kv()};
  const std::uint8_t axes = mod.tensor_axes(slot);
  std::vector<std::int64_t> dims = to_vector(tensor_dims(mod, slot, sizes));
  std::vector<std::int64_t> strides = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  for (int axis = 1; axis < 4; ++axis) {
    const bool spanned = axes & (1u << axis);
    const bool key_only = axis == 2 && (axes & kAxisKv) && !(axes & kAxisQ);  // 2: the query axis
    if (!spanned && (key_only || (axes & kAxisB))) {
      dims[static_cast<std::size_t>(axis)] = sizes[static_cast<std::size_t>(axis)];
      strides[static_cast<std::size_t>(axis)] = 0;
    }
  }
  return fe::graph::Tensor_attributes()
      .set_name("score_mod_tensor_" + std::to_string(slot))
      .set_uid(kUidScoreModTensor0 + slot)
      .set_dim(dims)
      .set_stride(strides)
      .set_data_type(fe::DataType_t::FLOAT);
}

// A score modifier: its scalars and tensors become inputs of the graph, and callbacks lower its
// expression where cuDNN forms the scores (and, in the backward, where it forms dS); the masks it
// writes in read apply_padding's lengths.
template <class Attributes>
void apply_score_mod(fe::graph::Graph& graph, Attributes& attributes, const AttentionSpec& spec, const Lengths& lengths,
                     std::vector<std::int64_t>& uids) {
  if (spec.score_mod.empty()) return;
  const ScoreMod& mod = spec.score_mod;
  ScoreModInputs inputs;
  for (int i = 0; i < mod.scalars(); ++i) {
    const std::string name = "score_mod_scalar_" + std::to_string(i);
    inputs.scalars.push_back(scalar_input(graph, name.c_str(), static_cast<Uid>(kUidScoreModScalar0 + i), uids));
  }
  for (int i = 0; i < mod.tensors(); ++i) {
    inputs.tensors.push_back(graph.tensor(score_mod_tensor(spec, i)));
    uids.push_back(kUidScoreModTensor0 + i);
  }
  inputs.seq_len_q = lengths.q;
  inputs.seq_len_kv = lengths.kv;
  auto lowering = std::make_shared<ScoreModLowering>(spec, std::move(inputs));
  attributes.set_score_mod([lowering](std::shared_ptr<fe::graph::Graph> g, TensorPtr score) {
    return lowering->forward(*g, score);
  });
  if constexpr (std::is_same_v<Attributes, fe::graph::SDPA_backward_attributes>) {
    attributes.set_score_mod_bprop([lowering](std::shared_ptr<fe::graph::Graph> g, TensorPtr d_score) {
      return lowering->backward(*g, d_score);
    });
  }
}

std::shared_ptr<fe::graph::Graph> new_graph(const AttentionSpec& spec, int target_sm) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(frontend_type(spec.q.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (target_sm != detail::kCurrentDeviceSm) graph->set_sm_version(target_sm);
  return graph;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const AttentionSpec& spec, fe::AttentionImplementation_t implementation,
                                                std::vector<std::int64_t>& uids, int target_sm) {
  auto graph = new_graph(spec, target_sm);
  auto q = graph->tensor(describe("q", kUidQ, spec.q));
  auto k = graph->tensor(describe("k", kUidK, spec.k));
  auto v = graph->tensor(describe("v", kUidV, spec.v));
  auto attributes = fe::graph::SDPA_attributes()
                        .set_name("fusedattn_forward")
                        .set_generate_stats(spec.stats)
                        .set_attn_scale(scale_tensor(*graph))
                        .set_implementation(implementation);
  apply_window(attributes, spec);
  uids = {kUidQ, kUidK, kUidV, kUidO, kUidScale};
  const bool wants_max = spec.max_logit != MaxLogit::none;  // then the statistics are formed outside
  const RaggedOffsets offsets = ragged_offsets(*graph, spec, spec.stats && !wants_max, uids);
  place(q, offsets.q);
  place(k, offsets.k);
  place(v, offsets.v);
  const Lengths lengths = apply_padding(*graph, attributes, spec, uids);
  apply_score_mod(*graph, attributes, spec, lengths, uids);
  apply_paging(*graph, attributes, spec, uids);
  apply_score_terms(*graph, attributes, spec, Pass::forward, uids);
  apply_dropout(*graph, attributes, spec, uids);
  if (spec.dropout_mask_out) {
    // The keep mask cuDNN drew, [b, h_q, s_q, s_kv] (0 or 1), for checks and debugging.
    const std::int64_t h = spec.heads_q(), sq = spec.seq_q(), skv = spec.seq_kv();
    auto mask = graph->tensor(fe::graph::Tensor_attributes()
                                  .set_name("dropout_mask")
                                  .set_uid(kUidDropoutMask)
                                  .set_dim({spec.batch(), h, sq, skv})
                                  .set_stride({h * sq * skv, sq * skv, skv, 1})
                                  .set_data_type(fe::DataType_t::FLOAT));
    mask->set_output(true);
    attributes.set_rng_dump(mask);
    uids.push_back(kUidDropoutMask);
  }
  if (wants_max) {
    // cuDNN's softmax gives either the statistics or each row's max and sum of exponentials, not
    // both; with a max logit it gives the latter and the execution layer forms the statistics
    // (max + log(sum)) from them.
    attributes.set_generate_stats(false);
    attributes.set_logit_max(row_tensor(*graph, spec, "max_logit", kUidMaxLogit));
    attributes.set_score_sum_exp(row_tensor(*graph, spec, "sum_exp", kUidSumExp));
    uids.push_back(kUidMaxLogit);
    uids.push_back(kUidSumExp);
  }
  TensorPtr o, stats;
  if (spec.fp8_scaling == Fp8Scaling::mxfp8) {
    const std::array<TensorPtr, 2> out = detail::mxfp8_outputs(*graph, spec, {q, k, v}, attributes, uids);
    o = out[0];
    stats = out[1];
  } else if (is_fp8(spec.q.dtype)) {
    // Q, K and V come with their descales; the probabilities are quantized inside with scale_s
    // (descale_s undoes it), O is written with scale_o, and the amaxes of S and O come out.
    auto out = graph->sdpa_fp8(q, k, v, scalar_input(*graph, "descale_q", kUidDescaleQ, uids),
                               scalar_input(*graph, "descale_k", kUidDescaleK, uids),
                               scalar_input(*graph, "descale_v", kUidDescaleV, uids),
                               scalar_input(*graph, "descale_s", kUidDescaleS, uids),
                               scalar_input(*graph, "scale_s", kUidScaleS, uids),
                               scalar_input(*graph, "scale_o", kUidScaleO, uids), attributes);
    o = out[0];
    stats = out[1];
    mark_scalar_output(out[2], "amax_s", kUidAmaxS, uids);
    mark_scalar_output(out[3], "amax_o", kUidAmaxO, uids);
  } else {
    auto out = graph->sdpa(q, k, v, attributes);
    o = out[0];
    stats = out[1];
  }
  mark_output(o, "o", kUidO, spec.o);
  place(o, offsets.o);
  if (spec.stats && !wants_max) {
    stats->set_output(true);
    auto described = stats_tensor(spec);
    stats->set_name("stats").set_uid(kUidStats).set_dim(described.get_dim()).set_stride(described.get_stride())
        .set_data_type(fe::DataType_t::FLOAT);
    place(stats, offsets.stats);
    uids.push_back(kUidStats);
  }
  std::sort(uids.begin(), uids.end());  // execute() takes pointers in ascending UID order
  return graph;
}

// dQ, dK, dV of an FP8 backward: every FP8 input comes with its descale, the probabilities and dP
// are quantized inside (scale_s, scale_dp, and their descales), and each gradient is written with
// its scale; the amaxes of dQ, dK, dV and dP come out.
std::array<TensorPtr, 3> fp8_gradients(fe::graph::Graph& graph, const std::array<TensorPtr, 6>& in,
                                       fe::graph::SDPA_fp8_backward_attributes& attributes,
                                       std::vector<std::int64_t>& uids) {
  auto scalar = [&](const char* name, Uid uid) { return scalar_input(graph, name, uid, uids); };
  auto out = graph.sdpa_fp8_backward(in[0], in[1], in[2], in[3], in[4], in[5], scalar("descale_q", kUidDescaleQ),
                                     scalar("descale_k", kUidDescaleK), scalar("descale_v", kUidDescaleV),
                                     scalar("descale_o", kUidDescaleO), scalar("descale_d_o", kUidDescaleDO),
                                     scalar("descale_s", kUidDescaleS), scalar("descale_d_p", kUidDescaleDP),
                                     scalar("scale_s", kUidScaleS), scalar("scale_d_q", kUidScaleDQ),
                                     scalar("scale_d_k", kUidScaleDK), scalar("scale_d_v", kUidScaleDV),
                                     scalar("scale_d_p", kUidScaleDP), attributes);
  mark_scalar_output(out[3], "amax_d_q", kUidAmaxDQ, uids);
  mark_scalar_output(out[4], "amax_d_k", kUidAmaxDK, uids);
  mark_scalar_output(out[5], "amax_d_v", kUidAmaxDV, uids);
  mark_scalar_output(out[6], "amax_d_p", kUidAmaxDP, uids);
  return {out[0], out[1], out[2]};
}

// dQ, dK, dV of a 16-bit backward, with the score terms (bias, ALiBi, sink, a score modifier) and
// their gradients.
std::array<TensorPtr, 3> gradients(fe::graph::Graph& graph, const std::array<TensorPtr, 6>& in, const AttentionSpec& spec,
                                   const Lengths& lengths, fe::graph::SDPA_backward_attributes& attributes,
                                   std::vector<std::int64_t>& uids) {
  apply_score_mod(graph, attributes, spec, lengths, uids);
  apply_score_terms(graph, attributes, spec, Pass::backward, uids);
  if (spec.bias_grad) {
    auto d_bias = graph.tensor(describe("d_bias", kUidDBias, bias_desc(spec)));
    d_bias->set_output(true);
    attributes.set_dbias(d_bias);
    uids.push_back(kUidDBias);
  }
  if (spec.softmax == Softmax::sink) {
    auto d_sink = graph.tensor(per_head(spec, "d_sink", kUidDSink));
    d_sink->set_output(true);
    attributes.set_dsink_token(d_sink);
    uids.push_back(kUidDSink);
  }
  auto out = graph.sdpa_backward(in[0], in[1], in[2], in[3], in[4], in[5], attributes);
  return {out[0], out[1], out[2]};
}

// The backward of either kind: `Attributes` is SDPA_backward_attributes (f16/bf16) or
// SDPA_fp8_backward_attributes (FP8), which share the mask, padding and dropout settings.
template <class Attributes>
std::shared_ptr<fe::graph::Graph> backward_graph(const AttentionSpec& spec, std::vector<std::int64_t>& uids,
                                                 int target_sm) {
  auto graph = new_graph(spec, target_sm);
  auto q = graph->tensor(describe("q", kUidQ, spec.q));
  auto k = graph->tensor(describe("k", kUidK, spec.k));
  auto v = graph->tensor(describe("v", kUidV, spec.v));
  auto o = graph->tensor(describe("o", kUidO, spec.o));
  auto d_o = graph->tensor(describe("d_o", kUidDO, gradient_desc(spec.o, spec)));
  auto stats = graph->tensor(stats_tensor(spec));
  auto attributes = Attributes()
                        .set_name("fusedattn_backward")
                        .set_attn_scale(scale_tensor(*graph))
                        .set_deterministic_algorithm(spec.deterministic);
  apply_window(attributes, spec);
  uids = {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidDO, kUidDQ, kUidDK, kUidDV};
  const RaggedOffsets offsets = ragged_offsets(*graph, spec, /*with_stats=*/true, uids);
  place(q, offsets.q);
  place(k, offsets.k);
  place(v, offsets.v);
  place(o, offsets.o);
  place(d_o, offsets.o);
  place(stats, offsets.stats);
  const Lengths lengths = apply_padding(*graph, attributes, spec, uids);
  apply_dropout(*graph, attributes, spec, uids);
  const std::array<TensorPtr, 6> in = {q, k, v, o, d_o, stats};
  std::array<TensorPtr, 3> grads;
  if constexpr (std::is_same_v<Attributes, fe::graph::SDPA_fp8_backward_attributes>) {
    grads = spec.fp8_scaling == Fp8Scaling::mxfp8 ? detail::mxfp8_gradients(*graph, spec, in, attributes, uids)
                                                  : fp8_gradients(*graph, in, attributes, uids);
  } else {
    grads = gradients(*graph, in, spec, lengths, attributes, uids);
  }
  std::sort(uids.begin(), uids.end());  // execute() takes pointers in ascending UID order
  // Gradients take their inputs' descriptors, so a packed input gets a packed gradient.
  mark_output(grads[0], "d_q", kUidDQ, gradient_desc(spec.q, spec));
  mark_output(grads[1], "d_k", kUidDK, gradient_desc(spec.k, spec));
  mark_output(grads[2], "d_v", kUidDV, gradient_desc(spec.v, spec));
  place(grads[0], offsets.q);
  place(grads[1], offsets.k);
  place(grads[2], offsets.v);
  return graph;
}

// Runs the build stages in order; the first failure becomes a reason naming the stage.
struct Attempt {
  std::shared_ptr<fe::graph::Graph> graph;
  std::vector<Reason> rejections;
  std::vector<std::int64_t> built;  // every_candidate: the indices of the plans that compiled
};

// The heuristics' first choice that cuDNN supports, compiled; or, for autotune, every plan the
// heuristics offer (modes A and B) that compiles.
Attempt compile(std::shared_ptr<fe::graph::Graph> graph, cudnnHandle_t handle, const char* implementation,
                bool every_candidate) {
  Attempt attempt;
  auto& r = attempt.rejections;
  if (!detail::lower(*graph, handle, implementation, r)) return attempt;
  if (!every_candidate) {
    bool ok = detail::stage_ok(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans",
                               implementation, r) &&
              detail::stage_ok(graph->check_support(handle), "check_support", implementation, r) &&
              detail::stage_ok(graph->build_plans(handle), "build_plans", implementation, r);
    if (ok) attempt.graph = std::move(graph);
    return attempt;
  }
  if (!detail::stage_ok(graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::B}),
                        "create_execution_plans", implementation, r)) {
    return attempt;
  }
  fe::error_t last;  // the failure among the candidates' answers, if any, else the last refusal
  for (std::int64_t i = 0; i < graph->get_execution_plan_count(); ++i) {
    fe::error_t status = graph->build_plan_at_index(handle, i);
    if (status.is_good()) {
      attempt.built.push_back(i);
    } else if (last.is_good() || fusedattn::detail::cudnn_failure_in(last.get_message()).empty()) {
      last = status;
    }
  }
  if (attempt.built.empty()) {
    detail::stage_ok(last.is_bad() ? last : fe::error_t{fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED,
                                                         "the heuristics offered no plan"},
                     "build_plan_at_index", implementation, r);
    return attempt;
  }
  attempt.graph = std::move(graph);
  return attempt;
}

// The spec's graph through every stage: the automatic implementation and, for a forward that it
// cannot serve, the composite one (the frontend's automatic choice can pick an implementation
// the backend then refuses; the composite one covers more configurations).
Attempt attempt_build(const AttentionSpec& spec, Pass pass, cudnnHandle_t handle, bool every_candidate,
                      std::vector<std::int64_t>& uids) {
  // The FP8 graphs below take no score modifier: refused here too, never built without it.
  if (!spec.score_mod.empty() && is_fp8(spec.q.dtype)) {
    return Attempt{nullptr, {Reason{"score_mod", to_string(spec.score_mod),
                                    "f16 or bf16 inputs (fusedattn's FP8 graphs take no score modifier)", ""}}, {}};
  }
  Attempt automatic = compile(detail::frontend_graph(spec, pass, fe::AttentionImplementation_t::AUTO, uids), handle,
                              "auto", every_candidate);
  if (automatic.graph || pass == Pass::backward) return automatic;
  uids.clear();
  Attempt composite = compile(detail::frontend_graph(spec, pass, fe::AttentionImplementation_t::COMPOSITE, uids),
                              handle, "composite", every_candidate);
  if (composite.graph) return composite;
  for (auto& reason : composite.rejections) {
    if (reason.requirement != automatic.rejections.front().requirement) automatic.rejections.push_back(std::move(reason));
  }
  return automatic;
}

BuildOutcome finish(Attempt attempt, std::vector<std::int64_t> uids) {
  BuildOutcome outcome;
  const std::size_t workspace = detail::workspace_of(*attempt.graph);
  outcome.graph = std::make_shared<detail::FrontendGraph>(std::move(attempt.graph), std::move(uids), workspace);
  return outcome;
}

}  // namespace

namespace detail {

std::shared_ptr<fe::graph::Graph> frontend_graph(const AttentionSpec& spec, Pass pass,
                                                 fe::AttentionImplementation_t implementation,
                                                 std::vector<std::int64_t>& uids, int target_sm) {
  if (pass == Pass::forward) return forward_graph(spec, implementation, uids, target_sm);
  return is_fp8(spec.q.dtype) ? backward_graph<fe::graph::SDPA_fp8_backward_attributes>(spec, uids, target_sm)
                              : backward_graph<fe::graph::SDPA_backward_attributes>(spec, uids, target_sm);
}

fe::graph::Tensor_attributes describe(const char* name, Uid uid, const TensorDesc& desc) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim(to_vector(desc.dims))
      .set_stride(frontend_strides(desc))
      .set_data_type(frontend_type(desc.dtype));
}

void mark_scalar_output(const TensorPtr& tensor, const char* name, Uid uid, std::vector<std::int64_t>& uids) {
  const fe::graph::Tensor_attributes desc = scalar_desc(name, uid);
  tensor->set_output(true).set_name(name).set_uid(uid).set_dim(desc.get_dim()).set_stride(desc.get_stride())
      .set_data_type(fe::DataType_t::FLOAT);
  uids.push_back(uid);
}

bool stage_ok(fe::error_t status, const char* stage, const char* implementation, std::vector<Reason>& rejections) {
  if (status.is_good()) return true;
  // A failure of the process (memory, execution, library) is no answer about the configuration:
  // raised, and so never cached as a refusal that would make callers fall back for good.
  if (!fusedattn::detail::cudnn_failure_in(status.get_message()).empty()) {
    throw CudnnError(std::string("cuDNN ") + stage + " (" + implementation + " implementation) failed: " +
                     status.get_message());
  }
  rejections.push_back(Reason{"cudnn", std::string(stage) + " (" + implementation + " implementation)",
                              "a configuration cuDNN accepts; cuDNN says: " + status.get_message(), ""});
  return false;
}

bool lower(fe::graph::Graph& graph, cudnnHandle_t handle, const char* implementation, std::vector<Reason>& rejections) {
  return stage_ok(graph.validate(), "validate", implementation, rejections) &&
         stage_ok(graph.build_operation_graph(handle), "build_operation_graph", implementation, rejections);
}

std::size_t workspace_of(const fe::graph::Graph& graph) {
  std::int64_t workspace = 0;
  auto status = graph.get_workspace_size(workspace);
  if (status.is_bad()) throw CudnnError("cuDNN get_workspace_size failed: " + status.get_message());
  return static_cast<std::size_t>(workspace);
}

void FrontendGraph::execute(cudnnHandle_t handle, void** sorted_pointers, void* workspace) const {
  auto status = graph_->execute(handle, sorted_pointers, static_cast<int>(uids_.size()), workspace);
  if (status.is_bad()) throw CudnnError("cuDNN execute failed: " + status.get_message());
}

bool FrontendGraph::record(cudnnHandle_t handle, void** sorted_pointers, void* workspace, cudaGraph_t into) const {
  std::unordered_map<std::int64_t, void*> by_uid;
  for (std::size_t i = 0; i < uids_.size(); ++i) by_uid.emplace(uids_[i], sorted_pointers[i]);
  // Straight into `into` where the frontend adds no copy or memset nodes of its own: the graph is
  // then the backend's, without a child-graph level around it.
  auto status = graph_->cuda_graph_direct_population_eligible()
                    ? graph_->populate_cuda_graph_direct(handle, by_uid, workspace, into)
                    : graph_->populate_cuda_graph(handle, by_uid, workspace, into);
  if (status.get_code() == fe::error_code_t::GRAPH_NOT_SUPPORTED) return false;  // a frontend-owned engine
  if (status.is_bad()) throw CudnnError("cuDNN populate_cuda_graph failed: " + status.get_message());
  return true;
}

}  // namespace detail

BuildOutcome build_graph(const AttentionSpec& spec, Pass pass, cudnnHandle_t handle) {
  std::vector<std::int64_t> uids;
  Attempt attempt = attempt_build(spec, pass, handle, false, uids);
  if (!attempt.graph) return BuildOutcome{nullptr, std::move(attempt.rejections)};
  return finish(std::move(attempt), std::move(uids));
}

CandidatesOutcome build_candidates(const AttentionSpec& spec, Pass pass, cudnnHandle_t handle) {
  std::vector<std::int64_t> uids;
  Attempt attempt = attempt_build(spec, pass, handle, true, uids);
  if (!attempt.graph) return CandidatesOutcome{nullptr, std::move(attempt.rejections)};
  return CandidatesOutcome{detail::make_candidates(std::move(attempt.graph), std::move(uids), std::move(attempt.built)), {}};
}

int frontend_version() noexcept { return CUDNN_FRONTEND_VERSION; }

std::string build_stamp() { return std::string(__DATE__ " " __TIME__ "/") + score_mod_lowering_build_stamp(); }

}  // namespace fusedattn::graph
