// Tier 1: a call's tensor set against its spec (src/spec/tensor_set.h) — every tensor the spec has
// given and aligned, none it lacks given, no output sharing memory with another tensor. Pointers
// are made-up addresses: the rules only compare them.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/spec.h"
#include "spec/tensor_set.h"
#include "tensor_set_fixtures.h"

namespace fusedattn {
namespace {

using detail::check_tensor_set;
using detail::tensors_overlap;
using namespace tensor_set_fixtures;

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
  expect_refused([&] { check_tensor_set(spec, forward_set()); }, "tensors.seq_len_kv", "null", "a device pointer");
  ForwardTensors t = forward_set();
  t.seq_len_kv = at<const std::int32_t>(11);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.bias", "null", "a device pointer");
  spec.dropout = 0.1;
  t.bias = at(12);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.dropout_seed", "null", "int64");
  t.dropout_seed = at<const std::int64_t>(13, 4);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.dropout_seed", "misaligned", "8-byte");
  t.dropout_seed = at<const std::int64_t>(13);
  t.dropout_offset = at<const std::int64_t>(13, 8);  // seed and offset side by side, as adapters keep them
  EXPECT_NO_THROW(check_tensor_set(spec, t));  // a forward's seq_len_q may be null: every entry's s_q rows
  t.seq_len_q = at<const std::int32_t>(10, 2);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.seq_len_q", "0x", "16-byte aligned");
  t.seq_len_q = at<const std::int32_t>(10);
  EXPECT_NO_THROW(check_tensor_set(spec, t));
}

TEST(TensorSet, ABackwardNeedsBothLengths) {
  AttentionSpec spec = spec_of(Layout::bshd);
  spec.stats = true;
  spec.padding = true;
  BackwardTensors b = backward_set();
  b.seq_len_kv = at<const std::int32_t>(11);
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.seq_len_q", "null", "a device pointer");
  b.seq_len_q = at<const std::int32_t>(10);
  EXPECT_NO_THROW(check_tensor_set(spec, b));
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

// --- MXFP8 (fp8_scaling=mxfp8: fusedattn/mxfp8_scales.h) ---------------------------------------

AttentionSpec mxfp8_spec() {
  AttentionSpec spec = spec_of(Layout::bshd);
  spec.q.dtype = spec.k.dtype = spec.v.dtype = DType::e4m3;
  spec.fp8_scaling = Fp8Scaling::mxfp8;  // O stays bf16
  validate(spec);
  return spec;
}

ForwardTensors mxfp8_forward_set() {
  ForwardTensors t = forward_set();
  t.mxfp8.sf_q = at<const std::uint8_t>(30);
  t.mxfp8.sf_k = at<const std::uint8_t>(31);
  t.mxfp8.sf_v = at<const std::uint8_t>(32);
  t.mxfp8.amax_o = at<float>(33);
  return t;
}

BackwardTensors mxfp8_backward_set() {
  BackwardTensors t = backward_set();
  Mxfp8BackwardTensors& m = t.mxfp8;
  m.q_t = at(30);
  m.k_t = at(31);
  m.d_o = at(32);
  m.d_o_t = at(33);
  m.sf_q = at<const std::uint8_t>(34);
  m.sf_q_t = at<const std::uint8_t>(35);
  m.sf_k = at<const std::uint8_t>(36);
  m.sf_k_t = at<const std::uint8_t>(37);
  m.sf_v = at<const std::uint8_t>(38);
  m.sf_d_o = at<const std::uint8_t>(39);
  m.sf_d_o_t = at<const std::uint8_t>(40);
  m.amax_d_q = at<float>(41);
  m.amax_d_k = at<float>(42);
  m.amax_d_v = at<float>(43);
  return t;
}

// Every MXFP8 pointer of each pass, by the name the refusals give it, with a way to clear it.
struct Mxfp8Field {
  const char* field;
  std::function<void(ForwardTensors&)> clear_forward;
  std::function<void(BackwardTensors&)> clear_backward;
  bool amax;
};

std::vector<Mxfp8Field> mxfp8_fields() {
  using F = ForwardTensors;
  using B = BackwardTensors;
  return {
      {"tensors.mxfp8.sf_q", [](F& t) { t.mxfp8.sf_q = nullptr; }, [](B& t) { t.mxfp8.sf_q = nullptr; }, false},
      {"tensors.mxfp8.sf_k", [](F& t) { t.mxfp8.sf_k = nullptr; }, [](B& t) { t.mxfp8.sf_k = nullptr; }, false},
      {"tensors.mxfp8.sf_v", [](F& t) { t.mxfp8.sf_v = nullptr; }, [](B& t) { t.mxfp8.sf_v = nullptr; }, false},
      {"tensors.mxfp8.amax_o", [](F& t) { t.mxfp8.amax_o = nullptr; }, nullptr, true},
      {"tensors.mxfp8.q_t", nullptr, [](B& t) { t.mxfp8.q_t = nullptr; }, false},
      {"tensors.mxfp8.k_t", nullptr, [](B& t) { t.mxfp8.k_t = nullptr; }, false},
      {"tensors.mxfp8.d_o", nullptr, [](B& t) { t.mxfp8.d_o = nullptr; }, false},
      {"tensors.mxfp8.d_o_t", nullptr, [](B& t) { t.mxfp8.d_o_t = nullptr; }, false},
      {"tensors.mxfp8.sf_q_t", nullptr, [](B& t) { t.mxfp8.sf_q_t = nullptr; }, false},
      {"tensors.mxfp8.sf_k_t", nullptr, [](B& t) { t.mxfp8.sf_k_t = nullptr; }, false},
      {"tensors.mxfp8.sf_d_o", nullptr, [](B& t) { t.mxfp8.sf_d_o = nullptr; }, false},
      {"tensors.mxfp8.sf_d_o_t", nullptr, [](B& t) { t.mxfp8.sf_d_o_t = nullptr; }, false},
      {"tensors.mxfp8.amax_d_q", nullptr, [](B& t) { t.mxfp8.amax_d_q = nullptr; }, true},
      {"tensors.mxfp8.amax_d_k", nullptr, [](B& t) { t.mxfp8.amax_d_k = nullptr; }, true},
      {"tensors.mxfp8.amax_d_v", nullptr, [](B& t) { t.mxfp8.amax_d_v = nullptr; }, true},
  };
}

TEST(Mxfp8TensorSet, AGoodSetPasses) {
  EXPECT_NO_THROW(check_tensor_set(mxfp8_spec(), mxfp8_forward_set()));
  EXPECT_NO_THROW(check_tensor_set(mxfp8_spec(), mxfp8_backward_set()));
}

TEST(Mxfp8TensorSet, EveryBlockScaleCopyAndAmaxIsRequired) {
  const AttentionSpec spec = mxfp8_spec();
  int cleared = 0;
  for (const Mxfp8Field& f : mxfp8_fields()) {
    const char* requirement = f.amax ? "float32 scalar" : "a device pointer";
    if (f.clear_forward) {
      ForwardTensors t = mxfp8_forward_set();
      f.clear_forward(t);
      expect_refused([&] { check_tensor_set(spec, t); }, f.field, "null", requirement);
      ++cleared;
    }
    if (f.clear_backward) {
      BackwardTensors b = mxfp8_backward_set();
      f.clear_backward(b);
      expect_refused([&] { check_tensor_set(spec, b); }, f.field, "null", requirement);
      ++cleared;
    }
  }
  EXPECT_EQ(cleared, 4 + 14);  // the forward's pointers and the backward's, each once
  ForwardTensors t = mxfp8_forward_set();
  t.mxfp8.sf_v = at<const std::uint8_t>(32, 8);  // cuDNN loads the scales in 16-byte pieces
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.mxfp8.sf_v", "0x", "16-byte aligned");
}

TEST(Mxfp8TensorSet, RefusedBesideAnyOtherSpec) {
  AttentionSpec per_tensor = mxfp8_spec();
  per_tensor.fp8_scaling = Fp8Scaling::tensor;
  per_tensor.o.dtype = DType::e4m3;
  const AttentionSpec sixteen_bit = spec_of(Layout::bshd);
  for (const AttentionSpec& spec : {sixteen_bit, per_tensor}) {
    ForwardTensors t = with_fp8_scales(forward_set());
    BackwardTensors b = with_fp8_scales(backward_set());
    ASSERT_NO_THROW(check_tensor_set(spec, t));
    ASSERT_NO_THROW(check_tensor_set(spec, b));
    t.mxfp8.sf_k = at<const std::uint8_t>(31);
    expect_refused([&] { check_tensor_set(spec, t); }, "tensors.mxfp8.sf_k", "0x", "fp8_scaling is not mxfp8");
    t.mxfp8.sf_k = nullptr;
    t.mxfp8.amax_o = at<float>(33);
    expect_refused([&] { check_tensor_set(spec, t); }, "tensors.mxfp8.amax_o", "0x", "fp8_scaling is not mxfp8");
    b.mxfp8.d_o_t = at(33);
    expect_refused([&] { check_tensor_set(spec, b); }, "tensors.mxfp8.d_o_t", "0x", "fp8_scaling is not mxfp8");
  }
}

TEST(Mxfp8TensorSet, PerTensorScalesAreRefused) {
  // A call built for per-tensor scaling would leave the block scales to chance.
  ForwardTensors t = mxfp8_forward_set();
  t.fp8.scale_o = at<const float>(20);
  expect_refused([&] { check_tensor_set(mxfp8_spec(), t); }, "tensors.fp8.scale_o", "0x", "MXFP8 block scales");
  BackwardTensors b = mxfp8_backward_set();
  b.fp8.amax_d_p = at<float>(20);
  expect_refused([&] { check_tensor_set(mxfp8_spec(), b); }, "tensors.fp8.amax_d_p", "0x", "MXFP8 block scales");
}

TEST(Mxfp8TensorSet, OutputsApartFromTheCopiesAndScales) {
  const AttentionSpec spec = mxfp8_spec();
  BackwardTensors b = mxfp8_backward_set();
  b.d_q = const_cast<void*>(b.mxfp8.q_t);
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.d_q", "overlaps tensors.mxfp8.q_t", "memory apart");
  b = mxfp8_backward_set();
  b.d_v = at(39, 16);  // inside dO's block scales (b * h_q * 128 rows * 4 blocks = 8 KiB)
  expect_refused([&] { check_tensor_set(spec, b); }, "tensors.d_v", "overlaps tensors.mxfp8.sf_d_o", "memory apart");
  ForwardTensors t = mxfp8_forward_set();
  // V's scales blocked along s: 2 * 2 heads of 128 rows (d = 64, padded) x 4 blocks (2, padded) = 2 KiB.
  t.o = at(32, 2048 - 16);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.o", "overlaps tensors.mxfp8.sf_v", "memory apart");
  t.o = at(32, 2048);  // right after them: apart
  EXPECT_NO_THROW(check_tensor_set(spec, t));
}

}  // namespace
}  // namespace fusedattn
