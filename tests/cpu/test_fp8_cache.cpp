// Tier 1: FP8 K/V caches beside 16-bit queries (AttentionSpec::fp8_kv_cache): what the spec takes
// (E4M3 k and v together, per-head descales only for a cache), which FP8 slots each kind of call
// takes (tensor_slots.h's takes_slot, which the tensor checks, the JAX custom call and the bindings
// share), and the tensor set's descales: required for a cache, every other FP8 slot refused.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/spec.h"
#include "fusedattn/tensor_slots.h"
#include "spec/tensor_set.h"
#include "tensor_set_fixtures.h"

namespace fusedattn {
namespace {

using detail::check_tensor_set;
using namespace tensor_set_fixtures;

AttentionSpec cache_spec(Fp8Scaling scaling = Fp8Scaling::tensor) {
  AttentionSpec spec = spec_of(Layout::bshd);
  spec.k.dtype = spec.v.dtype = DType::e4m3;
  spec.fp8_scaling = scaling;
  validate(spec);
  return spec;
}

template <class Scales>
std::set<std::string> taken(const AttentionSpec& spec) {
  std::set<std::string> out;
  for (const auto& slot : fp8_slots<Scales>()) {
    if (takes_slot(spec, slot)) out.insert(std::string(slot.name));
  }
  return out;
}

TEST(Fp8Cache, TheSpecTakesE4m3CachesBesideSixteenBitQueries) {
  for (DType q : {DType::bf16, DType::f16}) {
    AttentionSpec spec = spec_of(Layout::bshd);
    spec.q.dtype = spec.o.dtype = q;
    spec.k.dtype = spec.v.dtype = DType::e4m3;
    EXPECT_NO_THROW(validate(spec));
    EXPECT_TRUE(spec.fp8_kv_cache());
  }
  EXPECT_NO_THROW(cache_spec(Fp8Scaling::head));
  EXPECT_FALSE(spec_of(Layout::bshd).fp8_kv_cache());
}

TEST(Fp8Cache, OtherCachesAreRefusedByTheirField) {
  AttentionSpec e5m2 = spec_of(Layout::bshd);
  e5m2.k.dtype = e5m2.v.dtype = DType::e5m2;
  expect_refused([&] { validate(e5m2); }, "k.dtype", "e5m2", "or e4m3 for an FP8 K/V cache");
  AttentionSpec half_and_half = spec_of(Layout::bshd);
  half_and_half.k.dtype = DType::e4m3;
  expect_refused([&] { validate(half_and_half); }, "v.dtype", "bf16", "an FP8 K/V cache has both");
  AttentionSpec head = spec_of(Layout::bshd);
  head.fp8_scaling = Fp8Scaling::head;
  expect_refused([&] { validate(head); }, "fp8_scaling", "head", "an FP8 K/V cache");
}

TEST(Fp8Cache, EachKindOfCallTakesItsSlots) {
  const std::set<std::string> descales = {"descale_k", "descale_v"};
  for (Fp8Scaling scaling : {Fp8Scaling::tensor, Fp8Scaling::head}) {
    EXPECT_EQ(taken<Fp8ForwardScales>(cache_spec(scaling)), descales);
    EXPECT_EQ(taken<Fp8BackwardScales>(cache_spec(scaling)), descales);
  }
  EXPECT_TRUE(taken<Fp8ForwardScales>(spec_of(Layout::bshd)).empty());
  AttentionSpec fp8 = spec_of(Layout::bshd);
  fp8.q.dtype = fp8.k.dtype = fp8.v.dtype = fp8.o.dtype = DType::e4m3;
  EXPECT_EQ(taken<Fp8ForwardScales>(fp8).size(), kFp8ForwardSlots.size());
  EXPECT_EQ(taken<Fp8BackwardScales>(fp8).size(), kFp8BackwardSlots.size());
  fp8.fp8_scaling = Fp8Scaling::mxfp8;  // block scales instead
  EXPECT_TRUE(taken<Fp8ForwardScales>(fp8).empty());
  for (const auto& slot : kFp8ForwardSlots) {
    EXPECT_EQ(fp8_kv_cache_slot(slot.name), descales.count(std::string(slot.name)) == 1) << slot.name;
  }
}

TEST(Fp8Cache, TheTensorSetNeedsBothDescalesAndNothingElse) {
  const AttentionSpec spec = cache_spec(Fp8Scaling::head);
  ForwardTensors t = forward_set();
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.fp8.descale_k", "null", "float32 scalar");
  t.fp8.descale_k = at<const float>(20);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.fp8.descale_v", "null", "float32 scalar");
  t.fp8.descale_v = at<const float>(21);
  EXPECT_NO_THROW(check_tensor_set(spec, t));
  ForwardTensors all = with_fp8_scales(forward_set());  // an FP8 call's set
  expect_refused([&] { check_tensor_set(spec, all); }, "tensors.fp8.descale_q", "0x",
                 "an FP8 K/V cache, which takes descale_k and descale_v alone");
  t.fp8.amax_o = at<float>(22);
  expect_refused([&] { check_tensor_set(spec, t); }, "tensors.fp8.amax_o", "0x", "descale_k and descale_v alone");
  // A 16-bit call ignores the FP8 slots, as attention.h says.
  EXPECT_NO_THROW(check_tensor_set(spec_of(Layout::bshd), with_fp8_scales(forward_set())));
}

}  // namespace
}  // namespace fusedattn
