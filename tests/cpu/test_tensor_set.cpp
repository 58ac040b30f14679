// Tier 1: a call's tensor set against its spec (src/spec/tensor_set.h) — every tensor the spec has
// given and aligned, none it lacks given, no output sharing memory with another tensor. Pointers
// are made-up addresses: the rules only compare them.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/spec.h"
#include "spec/tensor_set.h"

namespace fusedattn {
namespace {

using detail::check_tensor_set;
using detail::tensors_overlap;

// Addresses far apart (1 GiB), each 256-byte aligned, as separate allocations would be.
template <class T = void>
T* at(int slot, std::int64_t byte_offset = 0) {
  return reinterpret_cast<T*>(std::uintptr_t{1} << 40 | std::uintptr_t(slot) << 30 | std::uintptr_t(byte_offset));
}

AttentionSpec spec_of(Layout layout, std::int64_t heads_kv = 2) {
  ProblemShape shape;
  shape.batch = 2;
  shape.seq_q = shape.seq_kv = 64;
  shape.heads_q = 8;
  shape.heads_kv = packs_qkv(layout) ? 8 : heads_kv;
  shape.head_dim_qk = shape.head_dim_v = 64;
  AttentionSpec spec = spec_for_layout(layout, shape);
  validate(spec);
  return spec;
}

ForwardTensors forward_set() {
  ForwardTensors t;
  t.q = at(1);
  t.k = at(2);
  t.v = at(3);
  t.o = at(4);
  t.stats = at<float>(5);
  return t;
}

BackwardTensors backward_set() {
  BackwardTensors t;
  t.q = at(1);
  t.k = at(2);
  t.v = at(3);
  t.o = at(4);
  t.d_o = at(5);
  t.stats = at<const float>(6);
  t.d_q = at(7);
  t.d_k = at(8);
  t.d_v = at(9);
  return t;
}

// Asserts InvalidArgument naming `field`, with `value` in its value and `requirement` in its requirement.
void expect_refused(const std::function<void()>& call, const std::string& field, const std::string& value,
                    const std::string& requirement) {
  try {
    call();
    FAIL() << "accepted; expected a refusal of " << field;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(e.value().find(value), std::string::npos) << e.what();
    EXPECT_NE(e.requirement().find(requirement), std::string::npos) << e.what();
  }
}

TEST(TensorSet, AGoodSetPasses) {
  AttentionSpec spec = spec_of(Layout::bshd);
  spec.stats = true;
  EXPECT_NO_THROW(check_tensor_set(spec, forward_set()));
  EXPECT_NO_THROW(check_tensor_set(spec, backward_set()));
}

TEST(TensorSet, NullAndMisalignedTensorsAreNamed) {
  AttentionSpec spec = spec_of(Layout::bshd);
  spec.stats = true;
  ForwardTensors t = forward_set();
  t.k = nullptr;
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.k", "null", "a device pointer");
  t = forward_set();
  t.v = at(3, 8);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.v", "0x", "16-byte aligned");
  BackwardTensors b = backward_set();
  b.d_o = nullptr;
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.d_o", "null", "a device pointer");
}

TEST(TensorSet, TensorsTheSpecHasAreRequired) {
  AttentionSpec spec = spec_of(Layout::bshd);
  spec.stats = true;
  spec.bias = Bias::one_hss;
  spec.padding = true;
  expect_refused([&] { check_tensor_set(spec, forward_set()); }, "tensors.seq_len_q", "null", "a device pointer");
  ForwardTensors t = forward_set();
  t.seq_len_q = at<const std::int32_t>(10);
  t.seq_len_kv = at<const std::int32_t>(11);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.bias", "null", "a device pointer");
  spec.dropout = 0.1;
  t.bias = at(12);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.dropout_seed", "null", "int64");
  t.dropout_seed = at<const std::int64_t>(13, 4);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.dropout_seed", "misaligned", "8-byte");
  t.dropout_seed = at<const std::int64_t>(13);
  t.dropout_offset = at<const std::int64_t>(13, 8);  // seed and offset side by side, as adapters keep them
  EXPECT_NO_THROW(check_tensor_set(spec, t));
}

TEST(TensorSet, TensorsTheSpecLacksAreRefused) {
  AttentionSpec spec = spec_of(Layout::bshd);  // no padding, bias, sink, dropout, pages, max logit
  spec.stats = false;                          // nor statistics (an inference call)
  struct Case {
    const char* field;
    std::function<void(ForwardTensors&)> give;
    const char* says;
  };
  const Case cases[] = {
      {"tensors.stats", [](ForwardTensors& t) { t.stats = at<float>(5); }, "stats=0"},
      {"tensors.seq_len_q", [](ForwardTensors& t) { t.seq_len_q = at<const std::int32_t>(10); }, "padding=0"},
      {"tensors.bias", [](ForwardTensors& t) { t.bias = at(12); }, "bias=none"},
      {"tensors.sink", [](ForwardTensors& t) { t.sink = at<const float>(12); }, "sink"},
      {"tensors.dropout_offset", [](ForwardTensors& t) { t.dropout_offset = at<const std::int64_t>(13); }, "dropout=0"},
      {"tensors.dropout_mask", [](ForwardTensors& t) { t.dropout_mask = at<float>(13); }, "dropout_mask=0"},
      {"tensors.page_table_v", [](ForwardTensors& t) { t.page_table_v = at<const std::int32_t>(14); }, "kv_pages=0"},
      {"tensors.max_logit", [](ForwardTensors& t) { t.max_logit = at<float>(15); }, "max_logit=none"},
      {"tensors.score_mod.tensors[1]", [](ForwardTensors& t) { t.score_mod.tensors[1] = at<const float>(16); },
       "score modifier"},
  };
  for (const Case& c : cases) {
    ForwardTensors t = forward_set();
    t.stats = nullptr;
    c.give(t);
    expect_refused([&] { check_tensor_set(spec, t); }, c.field, "0x", c.says);
  }
  BackwardTensors b = backward_set();
  b.d_bias = at(16);
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.d_bias", "0x", "bias_grad=0");
  b = backward_set();
  b.d_sink = at<float>(16);
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.d_sink", "0x", "sink");
}

TEST(TensorSet, IgnoredAsDocumented) {
  // FP8 scales beside a 16-bit spec and ragged arrays beside a dense one (attention.h says so).
  const AttentionSpec spec = spec_of(Layout::bshd);
  ForwardTensors t = forward_set();
  t.fp8.scale_o = at<const float>(20);
  t.ragged.cu_seqlens_q = at<const std::int32_t>(21);
  EXPECT_NO_THROW(check_tensor_set(spec, t));
}

TEST(TensorSet, RaggedSequencesAndOffsets) {
  AttentionSpec spec = spec_of(Layout::thd_thd_thd);
  ForwardTensors t = forward_set();
  t.stats = spec.stats ? t.stats : nullptr;
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.ragged.sequences", "0", "1 .. the plan's batch (2)");
  t.ragged.sequences = 3;
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.ragged.sequences", "3", "1 .. the plan's batch (2)");
  t.ragged.sequences = 2;
  t.ragged.cu_seqlens_q = at<const std::int32_t>(21);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.ragged.cu_seqlens_kv", "null", "int32 [sequences + 1]");
  t.ragged.cu_seqlens_kv = at<const std::int32_t>(22);
  EXPECT_NO_THROW(check_tensor_set(spec, t));
  // A ragged plan's extent is its bucket, larger than a call's buffer may be: O right after a
  // short Q is apart (the H200's support matrix ran such calls), O at Q's own start is not.
  t.o = at(1, 4096);
  EXPECT_NO_THROW(check_tensor_set(spec, t));
  t.o = const_cast<void*>(t.q);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.o", "overlaps tensors.q", "memory apart");
}

TEST(TensorSet, OutputsOverlappingInputsAreRefused) {
  AttentionSpec spec = spec_of(Layout::bshd);
  spec.stats = true;
  ForwardTensors t = forward_set();
  t.o = const_cast<void*>(t.q);  // in place
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.o", "overlaps tensors.q", "memory apart");
  // O's last 8 elements the first 8 of V (bf16: O spans 2*64*8*64 elements, 128 KiB).
  const std::int64_t o_bytes = spec.o.extent() * 2;
  t.o = at(3, 0);
  t.v = at(3, o_bytes - 16);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.o", "overlaps tensors.v", "memory apart");
  t = forward_set();
  t.o = at(4);
  t.stats = at<float>(4, 16 * 1024);  // inside O's 128 KiB
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.stats", "overlaps tensors.o", "memory apart");
  t.stats = at<float>(4, o_bytes);  // right after O: apart
  EXPECT_NO_THROW(check_tensor_set(spec, t));
  BackwardTensors b = backward_set();
  b.d_k = b.d_q;
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.d_k", "overlaps tensors.d_q", "memory apart");
  b = backward_set();
  b.d_v = reinterpret_cast<void*>(const_cast<float*>(b.stats));
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.d_v", "overlaps tensors.stats", "memory apart");
}

TEST(TensorSet, PackedGradientsInterleaveWithoutOverlapping) {
  // bs3hd: dQ, dK and dV are one buffer, each head's rows of the three side by side.
  AttentionSpec spec = spec_of(Layout::bs3hd);
  ProblemShape shape;
  shape.batch = 2;
  shape.seq_q = shape.seq_kv = 64;
  shape.heads_q = shape.heads_kv = 8;
  const LayoutTensors packed = make_layout(Layout::bs3hd, shape);
  BackwardTensors b = backward_set();
  b.q = at(1, packed.q_offset * 2);
  b.k = at(1, packed.k_offset * 2);
  b.v = at(1, packed.v_offset * 2);
  b.d_q = at(7, packed.q_offset * 2);
  b.d_k = at(7, packed.k_offset * 2);
  b.d_v = at(7, packed.v_offset * 2);
  EXPECT_NO_THROW(check_tensor_set(spec, b));
  b.d_k = at(7, packed.k_offset * 2 + 64);  // 32 elements on: dK's last head reaches into dV's first
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.d_v", "overlaps tensors.d_k", "memory apart");
  b.d_k = at(7, packed.k_offset * 2);
  b.d_q = const_cast<void*>(b.q);  // a gradient over its own input
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.d_q", "overlaps tensors.q", "memory apart");
}

TEST(TensorSet, TheScaleIsFinite) {
  EXPECT_NO_THROW(detail::check_scale(0.125f));
  EXPECT_NO_THROW(detail::check_scale(-1.0f));  // allowed: the caller's choice
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    expect_refused([&] { detail::check_scale(bad); }, "scale", "", "a finite number");
  }
}

TEST(TensorSet, OverlapOfStridedTensors) {
  TensorDesc rows;  // bf16 [1, 2, 4, 8], rows 16 elements apart: every other 8 elements free
  rows.dims = {1, 2, 4, 8};
  rows.strides = {128, 64, 16, 1};
  const auto* base = at<char>(1);
  EXPECT_FALSE(tensors_overlap(rows, base, rows, base + 16));   // 8 elements on: the gaps
  EXPECT_TRUE(tensors_overlap(rows, base, rows, base + 14));    // 7 elements on: shares a row's end
  EXPECT_TRUE(tensors_overlap(rows, base, rows, base + 32));    // one row on
  EXPECT_FALSE(tensors_overlap(rows, base, rows, base + 256));  // past the end: byte ranges apart
  EXPECT_TRUE(tensors_overlap(rows, base, rows, base + 1));     // half an element: not the same grid
  TensorDesc other = rows;
  other.strides = {128, 64, 16, 2};  // another grid: sharing a byte range counts
  EXPECT_TRUE(tensors_overlap(rows, base, other, base + 16));
  TensorDesc empty = rows;
  empty.dims[kSeq] = 0;
  EXPECT_FALSE(tensors_overlap(empty, base, rows, base));
}

}  // namespace
}  // namespace fusedattn
