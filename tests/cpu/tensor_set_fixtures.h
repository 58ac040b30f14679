// Tier 1's fixtures for tensor-set checks (src/spec/tensor_set.h): made-up device addresses, the
// specs and sets the tests start from, and a refusal's three parts. The rules only compare the
// addresses, so nothing is allocated.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>

#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/spec.h"

namespace fusedattn::tensor_set_fixtures {

// Addresses far apart (1 GiB), each 256-byte aligned, as separate allocations would be.
template <class T = void>
T* at(int slot, std::int64_t byte_offset = 0) {
  return reinterpret_cast<T*>(std::uintptr_t{1} << 40 | std::uintptr_t(slot) << 30 | std::uintptr_t(byte_offset));
}

inline AttentionSpec spec_of(Layout layout, std::int64_t heads_kv = 2) {
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

inline ForwardTensors forward_set() {
  ForwardTensors t;
  t.q = at(1);
  t.k = at(2);
  t.v = at(3);
  t.o = at(4);
  t.stats = at<float>(5);
  return t;
}

inline BackwardTensors backward_set() {
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
inline void expect_refused(const std::function<void()>& call, const std::string& field, const std::string& value,
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

// Every per-tensor FP8 scale of both passes given, as an FP8 spec scaled per tensor needs them.
template <class Tensors>
Tensors with_fp8_scales(Tensors t) {
  const auto* scale = at<const float>(20);
  auto* amax = at<float>(21);
  auto& f = t.fp8;
  f.descale_q = f.descale_k = f.descale_v = f.descale_s = f.scale_s = scale;
  if constexpr (std::is_same_v<Tensors, ForwardTensors>) {
    f.scale_o = scale;
    f.amax_s = f.amax_o = amax;
  } else {
    f.descale_o = f.descale_d_o = f.descale_d_p = f.scale_d_p = f.scale_d_q = f.scale_d_k = f.scale_d_v = scale;
    f.amax_d_q = f.amax_d_k = f.amax_d_v = f.amax_d_p = amax;
  }
  return t;
}

}  // namespace fusedattn::tensor_set_fixtures
