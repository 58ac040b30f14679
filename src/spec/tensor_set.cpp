// A call's tensor set against its spec (tensor_set.h).
#include "spec/tensor_set.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "fusedattn/errors.h"
#include "fusedattn/mxfp8.h"
#include "fusedattn/tensor_slots.h"

namespace fusedattn::detail {
namespace {

// cuDNN's attention kernels use 16-byte vector accesses on every operand.
constexpr std::uintptr_t kPointerAlignment = 16;

using Named = std::pair<const char*, const void*>;

std::string address(const void* pointer) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", pointer);
  return text;
}

// A float32 scalar in device memory (the FP8 scales, descales and amaxes).
void require_float_scalar(const char* field, const void* pointer) {
  if (pointer == nullptr) throw InvalidArgument(field, "null", "a device pointer to a float32 scalar");
  if (reinterpret_cast<std::uintptr_t>(pointer) % alignof(float) != 0) {
    throw InvalidArgument(field, "misaligned", "a 4-byte aligned device pointer to a float32 scalar");
  }
}

// A tensor the spec does not have must not be given: `has` says what the spec has instead.
void refuse_extra(const char* field, const void* pointer, const char* has) {
  if (pointer != nullptr) throw InvalidArgument(field, address(pointer), std::string("null: the spec has ") + has);
}

// An optional tensor: required (non-null, aligned) where the spec has it, refused where it does not
// (`otherwise` says what the spec has then).
void check_optional(const char* field, const void* pointer, bool spec_has, const char* otherwise) {
  if (spec_has) {
    require_pointer(field, pointer);
  } else {
    refuse_extra(field, pointer, otherwise);
  }
}

bool is_mxfp8(const AttentionSpec& spec) { return spec.fp8_scaling == Fp8Scaling::mxfp8; }

// Per-tensor FP8 scales: the slots the spec takes (tensor_slots.h's takes_slot: all of them for FP8
// attention, descale_k and descale_v for an FP8 K/V cache) are required, the others refused (a
// caller who gives them built the call for another kind); an MXFP8 spec takes block scales instead.
template <class Scales>
void check_fp8_scales(const AttentionSpec& spec, const Scales& scales) {
  if (!is_fp8(spec.q.dtype) && !spec.fp8_kv_cache()) return;  // a 16-bit call ignores them
  for (const auto& slot : fp8_slots<Scales>()) {
    const std::string field = "tensors.fp8." + std::string(slot.name);
    const void* pointer = slot_address(scales, slot);
    if (takes_slot(spec, slot)) {
      require_float_scalar(field.c_str(), pointer);
    } else if (is_mxfp8(spec)) {
      refuse_extra(field.c_str(), pointer,
                   "MXFP8 block scales (fp8_scaling=mxfp8: tensors.mxfp8), not per-tensor ones");
    } else {
      refuse_extra(field.c_str(), pointer, "an FP8 K/V cache, which takes descale_k and descale_v alone");
    }
  }
}

// MXFP8's tensors (`arrays`: FP8 copies and block scales, `amaxes`: float32 scalars): required for
// an MXFP8 spec, refused for any other.
void check_mxfp8(const AttentionSpec& spec, std::initializer_list<Named> arrays, std::initializer_list<Named> amaxes) {
  constexpr const char* kOther = "no MXFP8 block scaling (fp8_scaling is not mxfp8)";
  for (auto [field, pointer] : arrays) check_optional(field, pointer, is_mxfp8(spec), kOther);
  for (auto [field, pointer] : amaxes) {
    if (is_mxfp8(spec)) {
      require_float_scalar(field, pointer);
    } else {
      refuse_extra(field, pointer, kOther);
    }
  }
}

bool is_ragged(const AttentionSpec& spec) { return spec.ragged_q() || spec.ragged_kv(); }

// Whether a call's seq_len_q may be null under padding: a forward's (every entry's s_q rows).
enum class QueryLengths { required, optional };

// Runtime lengths: a padded dense spec needs both (a forward may leave seq_len_q out, attention.h);
// a ragged spec makes its own from the offsets (attention.h: seq_len_* are then unused); a spec
// without padding has none.
void check_lengths(const AttentionSpec& spec, const std::int32_t* seq_len_q, const std::int32_t* seq_len_kv,
                   QueryLengths query_lengths) {
  if (is_ragged(spec)) return;
  if (!spec.padding || query_lengths == QueryLengths::required || seq_len_q != nullptr) {
    check_optional("tensors.seq_len_q", seq_len_q, spec.padding, "no padding (padding=0)");
  }
  check_optional("tensors.seq_len_kv", seq_len_kv, spec.padding, "no padding (padding=0)");
}

// A ragged plan's batch is a bucket (fusedattn/ragged.h): the call says how many sequences it has.
void check_ragged(const AttentionSpec& spec, const RaggedTensors& ragged) {
  if (!is_ragged(spec)) return;
  if (ragged.sequences < 1 || ragged.sequences > spec.batch()) {
    throw InvalidArgument("tensors.ragged.sequences", std::to_string(ragged.sequences),
                          "1 .. the plan's batch (" + std::to_string(spec.batch()) + ")");
  }
  for (auto [field, pointer] : {Named{"tensors.ragged.cu_seqlens_q", ragged.cu_seqlens_q},
                                Named{"tensors.ragged.cu_seqlens_kv", ragged.cu_seqlens_kv}}) {
    if (pointer == nullptr) throw InvalidArgument(field, "null", "a device pointer to int32 [sequences + 1]");
  }
}

// Bias, sink and a score modifier's values: the inputs both passes share.
template <class Tensors>
void check_score_terms(const AttentionSpec& spec, const Tensors& t) {
  check_optional("tensors.bias", t.bias, spec.bias != Bias::none, "no bias (bias=none)");
  check_optional("tensors.sink", t.sink, spec.softmax == Softmax::sink, "no learnable sink (softmax is not sink)");
  if (spec.score_mod.scalars() > 0) {
    require_float_scalar("tensors.score_mod.scalars", t.score_mod.scalars);
  } else {
    refuse_extra("tensors.score_mod.scalars", t.score_mod.scalars, "no score modifier scalars");
  }
  static const char* const kTensorFields[] = {"tensors.score_mod.tensors[0]", "tensors.score_mod.tensors[1]",
                                              "tensors.score_mod.tensors[2]", "tensors.score_mod.tensors[3]"};
  static_assert(sizeof kTensorFields / sizeof kTensorFields[0] == kMaxScoreModTensors);
  for (int i = 0; i < kMaxScoreModTensors; ++i) {
    const float* tensor = t.score_mod.tensors[static_cast<std::size_t>(i)];
    check_optional(kTensorFields[i], tensor, i < spec.score_mod.tensors(), "fewer score modifier tensors");
  }
}

// Dropout's seed and offset: int64 scalars, which cuDNN reads as such (8-byte alignment).
void check_dropout(const AttentionSpec& spec, const std::int64_t* seed, const std::int64_t* offset) {
  for (auto [field, pointer] : {Named{"tensors.dropout_seed", seed}, Named{"tensors.dropout_offset", offset}}) {
    if (spec.dropout == 0.0) {
      refuse_extra(field, pointer, "no dropout (dropout=0)");
    } else if (pointer == nullptr) {
      throw InvalidArgument(field, "null", "a device pointer to an int64");
    } else if (reinterpret_cast<std::uintptr_t>(pointer) % alignof(std::int64_t) != 0) {
      throw InvalidArgument(field, "misaligned", "an 8-byte aligned device pointer");
    }
  }
}

// Whether `delta` (elements) is a difference of two index tuples of `desc`: sum of i_k * stride_k
// with |i_k| < dims_k. Axes go from the largest stride down; what the smaller ones can still add
// bounds each axis to at most two candidates when the strides nest (each larger than everything
// below it reaches, as validate() requires of outputs); otherwise, say yes (overlapping) rather
// than search.
bool reachable(std::int64_t delta, const TensorDesc& desc, const int* order, int axis, const std::int64_t* below) {
  if (axis == 4) return delta == 0;
  // The set of i * stride over |i| <= most is symmetric, so a negative stride counts as its size.
  const std::int64_t stride = std::llabs(desc.strides[order[axis]]), most = desc.dims[order[axis]] - 1;
  if (stride == 0 || most == 0) return reachable(delta, desc, order, axis + 1, below);
  const std::int64_t rest = below[axis];
  // Candidates i with |delta - i * stride| <= rest: from ceil((delta - rest) / stride) to
  // floor((delta + rest) / stride).
  auto floor_div = [](std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  const std::int64_t low = std::max(-most, -floor_div(rest - delta, stride));
  const std::int64_t high = std::min(most, floor_div(delta + rest, stride));
  if (high - low > 1) return true;
  for (std::int64_t i = low; i <= high; ++i) {
    if (reachable(delta - i * stride, desc, order, axis + 1, below)) return true;
  }
  return false;
}

// One memory region of a call: a described tensor, or (the float32 statistics) a plain byte range.
struct Region {
  const char* field;
  const void* data;
  const TensorDesc* desc = nullptr;
  std::size_t bytes = 0;  // when desc is null
};

std::uintptr_t begin_of(const Region& r) { return reinterpret_cast<std::uintptr_t>(r.data); }

// A ragged tensor's extent is its plan's bucket, which may be larger than the caller's buffer
// (the tokens and their placement are known only at run time): only its first element is certain.
std::size_t certain_bytes(const TensorDesc& desc) {
  if (desc.extent() == 0) return 0;
  return desc.ragged() ? size_of(desc.dtype) : static_cast<std::size_t>(desc.extent()) * size_of(desc.dtype);
}

std::uintptr_t end_of(const Region& r) { return begin_of(r) + (r.desc ? certain_bytes(*r.desc) : r.bytes); }

bool regions_overlap(const Region& a, const Region& b) {
  if (a.desc && b.desc) return tensors_overlap(*a.desc, a.data, *b.desc, b.data);
  return begin_of(a) < end_of(b) && begin_of(b) < end_of(a);
}

// Every output against every input and every output before it.
template <std::size_t In, std::size_t Out>
void check_apart(const Region (&inputs)[In], const Region (&outputs)[Out]) {
  for (std::size_t i = 0; i < Out; ++i) {
    auto refuse = [&](const Region& other) {
      throw InvalidArgument(outputs[i].field,
                            address(outputs[i].data) + " (overlaps " + other.field + " at " + address(other.data) + ")",
                            "memory apart from every input and every other output of the call");
    };
    for (const Region& input : inputs) {
      if (regions_overlap(outputs[i], input)) refuse(input);
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (regions_overlap(outputs[i], outputs[j])) refuse(outputs[j]);
    }
  }
}

// The float32 statistics, [b, h_q, s_q] dense; a ragged call's [T, h_q] has a length only the
// offsets know, so only its first element is certain to be there.
std::size_t stats_bytes(const AttentionSpec& spec) {
  if (is_ragged(spec)) return sizeof(float);
  return static_cast<std::size_t>(spec.batch() * spec.heads_q() * spec.seq_q()) * sizeof(float);
}

// The block scales of `of` blocked along `blocked`, as a byte range.
Region scales_region(const char* field, const std::uint8_t* data, const TensorDesc& of, Axis blocked) {
  return Region{field, data, nullptr, static_cast<std::size_t>(mxfp8_scale_shape(of.dims, blocked).swizzled_bytes())};
}

// An MXFP8 backward's FP8 copy of O (dO, and dO blocked along s): O's dims and strides in q's dtype.
TensorDesc fp8_o_desc(const AttentionSpec& spec) {
  TensorDesc out = spec.o;
  out.dtype = spec.q.dtype;
  return out;
}

}  // namespace

void check_scale(float scale) {
  if (!std::isfinite(scale)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(scale));
    throw InvalidArgument("scale", text, "a finite number");
  }
}

void require_pointer(const char* field, const void* pointer) {
  if (pointer == nullptr) throw InvalidArgument(field, "null", "a device pointer");
  if (reinterpret_cast<std::uintptr_t>(pointer) % kPointerAlignment != 0) {
    throw InvalidArgument(field, address(pointer), "a 16-byte aligned device pointer");
  }
}

bool tensors_overlap(const TensorDesc& a, const void* a_data, const TensorDesc& b, const void* b_data) noexcept {
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a_data), b_begin = reinterpret_cast<std::uintptr_t>(b_data);
  const std::size_t a_bytes = certain_bytes(a), b_bytes = certain_bytes(b);
  if (a_bytes == 0 || b_bytes == 0) return false;
  if (a_begin >= b_begin + b_bytes || b_begin >= a_begin + a_bytes) return false;
  const std::size_t element = size_of(a.dtype);
  const std::uintptr_t apart = a_begin > b_begin ? a_begin - b_begin : b_begin - a_begin;
  if (a.ragged() || b.ragged()) return true;  // their first elements meet
  if (a.dims != b.dims || a.strides != b.strides || a.dtype != b.dtype || apart % element != 0) return true;
  int order[4] = {0, 1, 2, 3};
  std::sort(order, order + 4, [&](int x, int y) { return std::llabs(a.strides[x]) > std::llabs(a.strides[y]); });
  std::int64_t below[4] = {0, 0, 0, 0};  // what the axes after each can add at most
  for (int axis = 2; axis >= 0; --axis) {
    below[axis] = below[axis + 1] + (a.dims[order[axis + 1]] - 1) * std::llabs(a.strides[order[axis + 1]]);
  }
  return reachable(static_cast<std::int64_t>(apart / element), a, order, 0, below);
}

void check_tensor_set(const AttentionSpec& spec, const ForwardTensors& t) {
  require_pointer("tensors.q", t.q);
  require_pointer("tensors.k", t.k);
  require_pointer("tensors.v", t.v);
  require_pointer("tensors.o", t.o);
  check_optional("tensors.stats", t.stats, spec.stats, "no statistics (stats=0)");
  check_lengths(spec, t.seq_len_q, t.seq_len_kv, QueryLengths::optional);
  check_ragged(spec, t.ragged);
  check_score_terms(spec, t);
  check_dropout(spec, t.dropout_seed, t.dropout_offset);
  check_optional("tensors.dropout_mask", t.dropout_mask, spec.dropout_mask_out,
                 "no dropout mask output (dropout_mask=0)");
  check_optional("tensors.page_table_k", t.page_table_k, spec.paged_kv(), "no paged cache (kv_pages=0)");
  check_optional("tensors.page_table_v", t.page_table_v, spec.paged_kv(), "no paged cache (kv_pages=0)");
  check_optional("tensors.max_logit", t.max_logit, spec.max_logit != MaxLogit::none, "no max logit (max_logit=none)");
  check_fp8_scales(spec, t.fp8);
  const Mxfp8ForwardTensors& m = t.mxfp8;
  check_mxfp8(spec,
              {{"tensors.mxfp8.sf_q", m.sf_q}, {"tensors.mxfp8.sf_k", m.sf_k}, {"tensors.mxfp8.sf_v", m.sf_v}},
              {{"tensors.mxfp8.amax_o", m.amax_o}});
  const Region inputs[] = {{"tensors.q", t.q, &spec.q}, {"tensors.k", t.k, &spec.k}, {"tensors.v", t.v, &spec.v}};
  auto apart = [&](const auto& outputs) {
    check_apart(inputs, outputs);
    if (!is_mxfp8(spec)) return;
    const Region scales[] = {scales_region("tensors.mxfp8.sf_q", m.sf_q, spec.q, kDim),
                             scales_region("tensors.mxfp8.sf_k", m.sf_k, spec.k, kDim),
                             scales_region("tensors.mxfp8.sf_v", m.sf_v, spec.v, kSeq)};
    check_apart(scales, outputs);
  };
  const Region o{"tensors.o", t.o, &spec.o};
  if (spec.stats) {
    const Region outputs[] = {o, {"tensors.stats", t.stats, nullptr, stats_bytes(spec)}};
    apart(outputs);
  } else {
    const Region outputs[] = {o};
    apart(outputs);
  }
}

void check_tensor_set(const AttentionSpec& spec, const BackwardTensors& t) {
  for (auto [field, pointer] :
       {Named{"tensors.q", t.q}, Named{"tensors.k", t.k}, Named{"tensors.v", t.v}, Named{"tensors.o", t.o},
        Named{"tensors.d_o", t.d_o}, Named{"tensors.stats", t.stats}, Named{"tensors.d_q", t.d_q},
        Named{"tensors.d_k", t.d_k}, Named{"tensors.d_v", t.d_v}}) {
    require_pointer(field, pointer);
  }
  check_lengths(spec, t.seq_len_q, t.seq_len_kv, QueryLengths::required);
  check_ragged(spec, t.ragged);
  check_score_terms(spec, t);
  check_dropout(spec, t.dropout_seed, t.dropout_offset);
  check_optional("tensors.d_bias", t.d_bias, spec.bias_grad, "no bias gradient (bias_grad=0)");
  check_optional("tensors.d_sink", t.d_sink, spec.softmax == Softmax::sink, "no learnable sink (softmax is not sink)");
  check_fp8_scales(spec, t.fp8);
  const Mxfp8BackwardTensors& m = t.mxfp8;
  check_mxfp8(spec,
              {{"tensors.mxfp8.q_t", m.q_t},       {"tensors.mxfp8.k_t", m.k_t},
               {"tensors.mxfp8.d_o", m.d_o},       {"tensors.mxfp8.d_o_t", m.d_o_t},
               {"tensors.mxfp8.sf_q", m.sf_q},     {"tensors.mxfp8.sf_q_t", m.sf_q_t},
               {"tensors.mxfp8.sf_k", m.sf_k},     {"tensors.mxfp8.sf_k_t", m.sf_k_t},
               {"tensors.mxfp8.sf_v", m.sf_v},     {"tensors.mxfp8.sf_d_o", m.sf_d_o},
               {"tensors.mxfp8.sf_d_o_t", m.sf_d_o_t}},
              {{"tensors.mxfp8.amax_d_q", m.amax_d_q}, {"tensors.mxfp8.amax_d_k", m.amax_d_k},
               {"tensors.mxfp8.amax_d_v", m.amax_d_v}});
  const TensorDesc d_q = gradient_desc(spec.q, spec), d_k = gradient_desc(spec.k, spec);
  const TensorDesc d_v = gradient_desc(spec.v, spec);
  const Region inputs[] = {{"tensors.q", t.q, &spec.q},
                           {"tensors.k", t.k, &spec.k},
                           {"tensors.v", t.v, &spec.v},
                           {"tensors.o", t.o, &spec.o},
                           {"tensors.d_o", t.d_o, &spec.o},
                           {"tensors.stats", t.stats, nullptr, stats_bytes(spec)}};
  const Region outputs[] = {{"tensors.d_q", t.d_q, &d_q}, {"tensors.d_k", t.d_k, &d_k}, {"tensors.d_v", t.d_v, &d_v}};
  check_apart(inputs, outputs);
  if (!is_mxfp8(spec)) return;
  const TensorDesc fp8_o = fp8_o_desc(spec);
  const Region copies[] = {{"tensors.mxfp8.q_t", m.q_t, &spec.q},
                           {"tensors.mxfp8.k_t", m.k_t, &spec.k},
                           {"tensors.mxfp8.d_o", m.d_o, &fp8_o},
                           {"tensors.mxfp8.d_o_t", m.d_o_t, &fp8_o},
                           scales_region("tensors.mxfp8.sf_q", m.sf_q, spec.q, kDim),
                           scales_region("tensors.mxfp8.sf_q_t", m.sf_q_t, spec.q, kSeq),
                           scales_region("tensors.mxfp8.sf_k", m.sf_k, spec.k, kDim),
                           scales_region("tensors.mxfp8.sf_k_t", m.sf_k_t, spec.k, kSeq),
                           scales_region("tensors.mxfp8.sf_v", m.sf_v, spec.v, kDim),
                           scales_region("tensors.mxfp8.sf_d_o", m.sf_d_o, spec.o, kDim),
                           scales_region("tensors.mxfp8.sf_d_o_t", m.sf_d_o_t, spec.o, kSeq)};
  check_apart(copies, outputs);
}

}  // namespace fusedattn::detail
