// Tier 1: the FP8 scaling slots' one table (fusedattn/tensor_slots.h) — every field of the scale
// structs in it exactly once, names and roles as fp8_scales.h documents them, passes consistent
// across the two tables, and the address helpers reaching the field each slot names.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "fusedattn/tensor_slots.h"

namespace fusedattn {
namespace {

// Each slot set to its own address, read back through the struct's named field by offset: distinct
// offsets covering every field prove the table names each field exactly once.
template <class Scales>
void expect_each_field_once() {
  Scales scales;
  const auto& slots = fp8_slots<Scales>();
  for (std::size_t i = 0; i < slots.size(); ++i) set_slot(scales, slots[i], 0x1000 * (i + 1));
  const auto* fields = reinterpret_cast<const std::uintptr_t*>(&scales);
  std::set<std::uintptr_t> seen;
  for (std::size_t field = 0; field < slots.size(); ++field) {
    EXPECT_NE(fields[field], 0u) << "field " << field << " has no slot";
    seen.insert(fields[field]);
  }
  EXPECT_EQ(seen.size(), slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(slot_address(scales, slots[i])), 0x1000 * (i + 1)) << slots[i].name;
  }
  std::set<std::string_view> names;
  for (const auto& slot : slots) names.insert(slot.name);
  EXPECT_EQ(names.size(), slots.size()) << "a name twice";
}

TEST(TensorSlots, EveryFieldOnce) {
  expect_each_field_once<Fp8ForwardScales>();
  expect_each_field_once<Fp8BackwardScales>();
}

TEST(TensorSlots, ForwardOrderAndRoles) {
  const char* const names[] = {"descale_q", "descale_k", "descale_v", "descale_s",
                               "scale_s",   "scale_o",   "amax_s",    "amax_o"};
  ASSERT_EQ(kFp8ForwardSlots.size(), std::size(names));
  for (std::size_t i = 0; i < kFp8ForwardSlots.size(); ++i) {
    const auto& slot = kFp8ForwardSlots[i];
    EXPECT_EQ(slot.name, names[i]);
    EXPECT_EQ(slot.role, i < 6 ? SlotRole::fp8_scale_read : SlotRole::fp8_amax_written) << slot.name;
    EXPECT_TRUE(slot.passes & kForwardSlot) << slot.name;
  }
  EXPECT_EQ(kFp8ForwardSlots[0].read, &Fp8ForwardScales::descale_q);
  EXPECT_EQ(kFp8ForwardSlots[7].written, &Fp8ForwardScales::amax_o);
}

TEST(TensorSlots, BackwardOrderAndRoles) {
  const char* const names[] = {"descale_q", "descale_k", "descale_v", "descale_o", "descale_d_o", "descale_s",
                               "descale_d_p", "scale_s", "scale_d_p", "scale_d_q", "scale_d_k", "scale_d_v",
                               "amax_d_q",  "amax_d_k",  "amax_d_v",  "amax_d_p"};
  ASSERT_EQ(kFp8BackwardSlots.size(), std::size(names));
  for (std::size_t i = 0; i < kFp8BackwardSlots.size(); ++i) {
    const auto& slot = kFp8BackwardSlots[i];
    EXPECT_EQ(slot.name, names[i]);
    EXPECT_EQ(slot.role, i < 12 ? SlotRole::fp8_scale_read : SlotRole::fp8_amax_written) << slot.name;
    EXPECT_TRUE(slot.passes & kBackwardSlot) << slot.name;
  }
  EXPECT_EQ(kFp8BackwardSlots[4].read, &Fp8BackwardScales::descale_d_o);
  EXPECT_EQ(kFp8BackwardSlots[15].written, &Fp8BackwardScales::amax_d_p);
}

// A slot said to serve both passes is in both tables under one name; one said to serve one pass
// is in that pass's table only.
TEST(TensorSlots, PassesAgreeAcrossTables) {
  auto in = [](const auto& slots, std::string_view name) {
    for (const auto& slot : slots) {
      if (slot.name == name) return true;
    }
    return false;
  };
  for (const auto& slot : kFp8ForwardSlots) {
    EXPECT_EQ(in(kFp8BackwardSlots, slot.name), (slot.passes & kBackwardSlot) != 0) << slot.name;
  }
  for (const auto& slot : kFp8BackwardSlots) {
    EXPECT_EQ(in(kFp8ForwardSlots, slot.name), (slot.passes & kForwardSlot) != 0) << slot.name;
  }
}

// Reads are the const fields, amaxes the written ones: the role names the member pointer set.
TEST(TensorSlots, RoleNamesItsMemberPointer) {
  for (const auto& slot : kFp8ForwardSlots) {
    EXPECT_EQ(slot.read != nullptr, slot.role == SlotRole::fp8_scale_read) << slot.name;
    EXPECT_EQ(slot.written != nullptr, slot.role == SlotRole::fp8_amax_written) << slot.name;
  }
  for (const auto& slot : kFp8BackwardSlots) {
    EXPECT_EQ(slot.read != nullptr, slot.role == SlotRole::fp8_scale_read) << slot.name;
    EXPECT_EQ(slot.written != nullptr, slot.role == SlotRole::fp8_amax_written) << slot.name;
  }
}

}  // namespace
}  // namespace fusedattn
