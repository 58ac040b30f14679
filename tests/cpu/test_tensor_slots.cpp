// Tier 1: the tensor sets' slots (fusedattn/tensor_slots.h) — every field of the tensor sets and of
// the scale structs listed exactly once, names and roles as attention.h and fp8_scales.h document
// them, passes consistent across the two passes, and the address helpers reaching each slot's field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// The byte ranges of a tensor set's fields: those the list visits, and the nested groups that keep
// their own homes. Distinct, and together the whole struct: every field is listed, none twice.
template <class Set>
std::vector<std::pair<std::size_t, std::size_t>> covered(std::map<std::string, std::pair<SlotRole, unsigned>>& listed) {
  static Set set;
  const auto* base = reinterpret_cast<const char*>(&set);
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  auto add = [&](const auto& field) {
    ranges.emplace_back(static_cast<std::size_t>(reinterpret_cast<const char*>(&field) - base), sizeof field);
  };
  for_each_tensor_slot<Set>([&](const char* name, SlotRole role, unsigned passes, auto member) {
    EXPECT_TRUE(listed.emplace(name, std::make_pair(role, passes)).second) << name << " listed twice";
    add(set.*member);
  });
  add(set.ragged);
  add(set.fp8);
  add(set.mxfp8);
  add(set.score_mod);
  return ranges;
}

template <class Set>
void expect_whole_struct(std::map<std::string, std::pair<SlotRole, unsigned>>& listed) {
  auto ranges = covered<Set>(listed);
  std::sort(ranges.begin(), ranges.end());
  std::size_t end = 0;
  for (const auto& [offset, size] : ranges) {
    EXPECT_EQ(offset, end) << "a field at byte " << end << " is not listed (or two overlap)";
    end = offset + size;
  }
  EXPECT_EQ(end, sizeof(Set)) << "fields at the struct's end are not listed";
}

TEST(TensorSlots, EveryTensorFieldOnce) {
  std::map<std::string, std::pair<SlotRole, unsigned>> forward, backward;
  expect_whole_struct<ForwardTensors>(forward);
  expect_whole_struct<BackwardTensors>(backward);
  EXPECT_EQ(forward.at("o").first, SlotRole::output);
  EXPECT_EQ(backward.at("o").first, SlotRole::input);  // the forward's output, read back
  EXPECT_EQ(forward.at("max_logit").first, SlotRole::output);
  EXPECT_EQ(forward.at("page_table_k").first, SlotRole::runtime_array);
  EXPECT_EQ(backward.at("d_q").first, SlotRole::output);
  EXPECT_EQ(backward.at("seq_len_kv").first, SlotRole::runtime_array);
  EXPECT_EQ(backward.at("bias").first, SlotRole::input);
  // A slot of both passes is in both sets; one of one pass, in that pass's only.
  for (const auto& [name, role_passes] : forward) {
    EXPECT_EQ(backward.count(name) == 1, (role_passes.second & kBackwardSlot) != 0) << name;
  }
  for (const auto& [name, role_passes] : backward) {
    EXPECT_EQ(forward.count(name) == 1, (role_passes.second & kForwardSlot) != 0) << name;
  }
}

}  // namespace
}  // namespace fusedattn
