// fusedattn/tensor_slots.h — the slots of each pass's tensor set (attention.h) as one list: its
// top-level tensors (for_each_tensor_slot) and its FP8 scaling scalars (fp8_scales.h, a constexpr
// table), which the checks, the Python properties, the JAX custom call's operand order and the
// adapters' lists all walk, so a slot added or renamed here is added or renamed everywhere at once.
// The nested groups keep their own homes: ragged offsets (RaggedTensors), MXFP8's block scales
// (mxfp8_scales.h) and a score modifier's values (ScoreModTensors).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "fusedattn/attention.h"
#include "fusedattn/fp8_scales.h"

namespace fusedattn {

/// What a call does with a slot.
enum class SlotRole : std::uint8_t {
  input,             ///< a tensor the kernels read (q, k, v, bias, ...)
  output,            ///< a tensor the kernels write (o, stats, gradients, ...)
  runtime_array,     ///< small device arrays of run-time values: lengths, page tables, dropout's seed
  fp8_scale_read,    ///< a scale or descale the kernels read (the JAX call's operand)
  fp8_amax_written,  ///< an amax the kernels write (the JAX call's result)
};

/// The passes that use a slot (a bit set).
enum SlotPasses : unsigned { kForwardSlot = 1u, kBackwardSlot = 2u };

/// One slot of `Scales` (Fp8ForwardScales or Fp8BackwardScales): its name as the bindings, the
/// adapters and the error messages spell it ("descale_q"; messages prefix "tensors.fp8."), its
/// role, and the field; `read` is set for fp8_scale_read and `written` for fp8_amax_written (the
/// two kinds of field differ in constness, so one member pointer cannot name both).
template <class Scales>
struct Fp8Slot {
  std::string_view name;
  SlotRole role;
  unsigned passes;
  const float* Scales::*read = nullptr;
  float* Scales::*written = nullptr;
};

namespace slot_detail {
template <class Scales>
constexpr Fp8Slot<Scales> read(std::string_view name, unsigned passes, const float* Scales::*field) {
  return {name, SlotRole::fp8_scale_read, passes, field, nullptr};
}
template <class Scales>
constexpr Fp8Slot<Scales> written(std::string_view name, unsigned passes, float* Scales::*field) {
  return {name, SlotRole::fp8_amax_written, passes, nullptr, field};
}
constexpr unsigned kBoth = kForwardSlot | kBackwardSlot;
}  // namespace slot_detail

/// THE forward list, in the JAX custom call's order: its scales are operands after all others,
/// its amaxes results after all others (python/bindings/jax_ffi.cpp).
inline constexpr std::array<Fp8Slot<Fp8ForwardScales>, 8> kFp8ForwardSlots = [] {
  using namespace slot_detail;
  using F = Fp8ForwardScales;
  return std::array<Fp8Slot<F>, 8>{
      read("descale_q", kBoth, &F::descale_q),      read("descale_k", kBoth, &F::descale_k),
      read("descale_v", kBoth, &F::descale_v),      read("descale_s", kBoth, &F::descale_s),
      read("scale_s", kBoth, &F::scale_s),          read("scale_o", kForwardSlot, &F::scale_o),
      written("amax_s", kForwardSlot, &F::amax_s),  written("amax_o", kForwardSlot, &F::amax_o)};
}();

/// THE backward list, in the JAX custom call's order.
inline constexpr std::array<Fp8Slot<Fp8BackwardScales>, 16> kFp8BackwardSlots = [] {
  using namespace slot_detail;
  using B = Fp8BackwardScales;
  return std::array<Fp8Slot<B>, 16>{
      read("descale_q", kBoth, &B::descale_q),
      read("descale_k", kBoth, &B::descale_k),
      read("descale_v", kBoth, &B::descale_v),
      read("descale_o", kBackwardSlot, &B::descale_o),
      read("descale_d_o", kBackwardSlot, &B::descale_d_o),
      read("descale_s", kBoth, &B::descale_s),
      read("descale_d_p", kBackwardSlot, &B::descale_d_p),
      read("scale_s", kBoth, &B::scale_s),
      read("scale_d_p", kBackwardSlot, &B::scale_d_p),
      read("scale_d_q", kBackwardSlot, &B::scale_d_q),
      read("scale_d_k", kBackwardSlot, &B::scale_d_k),
      read("scale_d_v", kBackwardSlot, &B::scale_d_v),
      written("amax_d_q", kBackwardSlot, &B::amax_d_q),
      written("amax_d_k", kBackwardSlot, &B::amax_d_k),
      written("amax_d_v", kBackwardSlot, &B::amax_d_v),
      written("amax_d_p", kBackwardSlot, &B::amax_d_p)};
}();

// Every field of the scale structs is a float pointer, so their sizes count the fields: a field
// added to fp8_scales.h without a slot here stops the build.
static_assert(sizeof(Fp8ForwardScales) == kFp8ForwardSlots.size() * sizeof(float*));
static_assert(sizeof(Fp8BackwardScales) == kFp8BackwardSlots.size() * sizeof(float*));

/// THE list of each tensor set's top-level tensors: `f(name, role, passes, member)` once per field,
/// `member` a pointer to the field (of its own type, so this is a visitor rather than an array).
/// tests/cpu/test_tensor_slots.cpp checks that every field is visited once.
template <class Set, class F>
constexpr void for_each_tensor_slot(F&& f) {
  constexpr unsigned kBoth = kForwardSlot | kBackwardSlot;
  f("q", SlotRole::input, kBoth, &Set::q);
  f("k", SlotRole::input, kBoth, &Set::k);
  f("v", SlotRole::input, kBoth, &Set::v);
  if constexpr (std::is_same_v<Set, ForwardTensors>) {
    f("o", SlotRole::output, kBoth, &Set::o);
    f("stats", SlotRole::output, kBoth, &Set::stats);
  } else {
    f("o", SlotRole::input, kBoth, &Set::o);  // the forward's outputs, read back
    f("d_o", SlotRole::input, kBackwardSlot, &Set::d_o);
    f("stats", SlotRole::input, kBoth, &Set::stats);
    f("d_q", SlotRole::output, kBackwardSlot, &Set::d_q);
    f("d_k", SlotRole::output, kBackwardSlot, &Set::d_k);
    f("d_v", SlotRole::output, kBackwardSlot, &Set::d_v);
  }
  f("seq_len_q", SlotRole::runtime_array, kBoth, &Set::seq_len_q);
  f("seq_len_kv", SlotRole::runtime_array, kBoth, &Set::seq_len_kv);
  f("bias", SlotRole::input, kBoth, &Set::bias);
  f("sink", SlotRole::input, kBoth, &Set::sink);
  f("dropout_seed", SlotRole::runtime_array, kBoth, &Set::dropout_seed);
  f("dropout_offset", SlotRole::runtime_array, kBoth, &Set::dropout_offset);
  if constexpr (std::is_same_v<Set, ForwardTensors>) {
    f("max_logit", SlotRole::output, kForwardSlot, &Set::max_logit);
    f("dropout_mask", SlotRole::output, kForwardSlot, &Set::dropout_mask);
    f("page_table_k", SlotRole::runtime_array, kForwardSlot, &Set::page_table_k);
    f("page_table_v", SlotRole::runtime_array, kForwardSlot, &Set::page_table_v);
  } else {
    f("d_bias", SlotRole::output, kBackwardSlot, &Set::d_bias);
    f("d_sink", SlotRole::output, kBackwardSlot, &Set::d_sink);
  }
}

/// The table of a scale struct.
template <class Scales>
constexpr const auto& fp8_slots() noexcept {
  if constexpr (std::is_same_v<Scales, Fp8ForwardScales>) {
    return kFp8ForwardSlots;
  } else {
    return kFp8BackwardSlots;
  }
}

/// Whether a call of `spec` takes a slot: an FP8 call (q, k, v in FP8, per tensor) takes them all,
/// an FP8 K/V cache beside 16-bit queries (AttentionSpec::fp8_kv_cache) its two descales alone
/// (float32 scalars, or [h_kv] with fp8_scaling=head), any other call none. MXFP8 calls take their
/// block scales instead (mxfp8.h). The tensor checks, the JAX custom call's operands and the
/// bindings' slot lists all ask here.
/// The slots of an FP8 K/V cache's call: its two descales.
constexpr bool fp8_kv_cache_slot(std::string_view name) noexcept { return name == "descale_k" || name == "descale_v"; }

template <class Scales>
inline bool takes_slot(const AttentionSpec& spec, const Fp8Slot<Scales>& slot) noexcept {
  if (spec.fp8_kv_cache()) return fp8_kv_cache_slot(slot.name);
  return is_fp8(spec.q.dtype) && spec.fp8_scaling != Fp8Scaling::mxfp8;
}

/// A slot's address in `scales` (null where unset).
template <class Scales>
const void* slot_address(const Scales& scales, const Fp8Slot<Scales>& slot) noexcept {
  return slot.role == SlotRole::fp8_scale_read ? static_cast<const void*>(scales.*slot.read)
                                               : static_cast<const void*>(scales.*slot.written);
}

/// Sets a slot of `scales` to a device address.
template <class Scales>
void set_slot(Scales& scales, const Fp8Slot<Scales>& slot, std::uintptr_t address) noexcept {
  if (slot.role == SlotRole::fp8_scale_read) {
    scales.*slot.read = reinterpret_cast<const float*>(address);
  } else {
    scales.*slot.written = reinterpret_cast<float*>(address);
  }
}

}  // namespace fusedattn
