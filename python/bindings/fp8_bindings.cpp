// fusedattn._core's FP8 part: the scaling tensors of FP8 calls as named addresses on the tensor
// sets, and the scaling kernels of fusedattn/fp8.h (quantize, amax, scales), for the adapters'
// FP8 recipes. Tensors arrive as (dtype name, sizes, strides) views and device addresses.
#include "fp8_bindings.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"
#include "fusedattn/tensor_slots.h"

namespace nb = nanobind;
namespace fa = fusedattn;
using namespace nb::literals;

namespace fusedattn::python {
namespace {

template <class T>
T* pointer(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

cudaStream_t stream_of(std::uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

// A framework tensor of 1 to 4 dims as the kernels' descriptor: the kernels work element by
// element on two tensors of equal dims, so which axis is which does not matter, only that both
// tensors of a call list them alike. Missing leading dims are 1 (with a non-zero stride: a zero
// batch stride means ragged).
fa::TensorDesc elementwise_desc(const nb::handle& described, const char* name) {
  auto [dtype, sizes, strides] =
      nb::cast<std::tuple<std::string, std::vector<std::int64_t>, std::vector<std::int64_t>>>(described);
  if (sizes.empty() || sizes.size() > 4 || sizes.size() != strides.size()) {
    throw fa::InvalidArgument(std::string(name) + ".shape", std::to_string(sizes.size()) + " dims",
                              "1 to 4 dims, with as many strides");
  }
  fa::TensorDesc desc;
  desc.dtype = fa::parse_dtype(dtype, std::string(name) + ".dtype");
  const std::size_t pad = 4 - sizes.size();
  std::int64_t extent = 1;
  for (std::size_t i = 0; i < sizes.size(); ++i) extent += (sizes[i] - 1) * strides[i];
  for (std::size_t axis = 0; axis < 4; ++axis) {
    desc.dims[axis] = axis < pad ? 1 : sizes[axis - pad];
    desc.strides[axis] = axis < pad ? extent : strides[axis - pad];
  }
  return desc;
}

// Each FP8 slot of `Set` (fusedattn/tensor_slots.h) as a read-write address property. The table's
// names are string literals, so their data outlives the class.
template <class Set, class Class>
void bind_scale_slots(Class& cls) {
  using Scales = decltype(Set::fp8);
  for (const fa::Fp8Slot<Scales>& slot : fa::fp8_slots<Scales>()) {
    cls.def_prop_rw(
        slot.name.data(),
        [slot](const Set& set) { return reinterpret_cast<std::uintptr_t>(fa::slot_address(set.fp8, slot)); },
        [slot](Set& set, std::uintptr_t value) { fa::set_slot(set.fp8, slot, value); });
  }
}

// A pass's slots as (name, role) pairs in the table's order, role "scale" (read) or "amax" (written):
// an FP8 call's, or with kv_cache an FP8 K/V cache's (its descales).
template <class Scales>
std::vector<std::tuple<std::string, std::string>> slot_list(bool kv_cache) {
  std::vector<std::tuple<std::string, std::string>> out;
  for (const fa::Fp8Slot<Scales>& slot : fa::fp8_slots<Scales>()) {
    if (kv_cache && !fa::fp8_kv_cache_slot(slot.name)) continue;
    out.emplace_back(std::string(slot.name), slot.role == fa::SlotRole::fp8_scale_read ? "scale" : "amax");
  }
  return out;
}

// "from_amax", "delayed" or "keep" as the rule it names.
fa::Fp8ScaleRule parse_rule(const std::string& rule, const std::string& field) {
  if (rule == "from_amax") return fa::Fp8ScaleRule::from_amax;
  if (rule == "delayed") return fa::Fp8ScaleRule::delayed;
  if (rule == "keep") return fa::Fp8ScaleRule::keep;
  throw fa::InvalidArgument(field, rule, "\"from_amax\", \"delayed\" or \"keep\"");
}

// A Python integer address as a typed pointer.
template <class T>
T* at(const nb::handle& address) {
  return pointer<T>(nb::cast<std::uintptr_t>(address));
}

// Each element of the list `items` (named `name` in errors, name[i] for one element) as the C++
// struct `make` builds from its tuple.
template <class Out, class Make>
std::vector<Out> each(const nb::list& items, const char* name, Make make) {
  std::vector<Out> out;
  out.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    out.push_back(make(nb::tuple(items[i]), std::string(name) + "[" + std::to_string(i) + "]"));
  }
  return out;
}

void bind_many(nb::module_& m) {
  m.def(
      "quantize_fp8_many",
      [](const nb::list& tensors, std::uintptr_t stream) {
        auto jobs = each<fa::Fp8Quantization>(tensors, "tensors", [](const nb::tuple& t, const std::string& name) {
          return fa::Fp8Quantization{elementwise_desc(t[0], (name + ".src").c_str()), at<const void>(t[1]),
                                     elementwise_desc(t[2], (name + ".dst").c_str()), at<void>(t[3]),
                                     at<const float>(t[4]), at<float>(t[5])};
        });
        fa::quantize_fp8_many(jobs.data(), static_cast<int>(jobs.size()), stream_of(stream));
      },
      "tensors"_a, "stream"_a,
      "quantize_fp8 of several tensors, each (src, src_data, dst, dst_data, scale, amax), in as few launches as "
      "their orders allow.");
  m.def(
      "dequantize_fp8_many",
      [](const nb::list& tensors, std::uintptr_t stream) {
        auto jobs = each<fa::Fp8Dequantization>(tensors, "tensors", [](const nb::tuple& t, const std::string& name) {
          return fa::Fp8Dequantization{elementwise_desc(t[0], (name + ".src").c_str()), at<const void>(t[1]),
                                       elementwise_desc(t[2], (name + ".dst").c_str()), at<void>(t[3]),
                                       at<const float>(t[4])};
        });
        fa::dequantize_fp8_many(jobs.data(), static_cast<int>(jobs.size()), stream_of(stream));
      },
      "tensors"_a, "stream"_a, "dequantize_fp8 of several tensors, each (src, src_data, dst, dst_data, descale).");
  m.def(
      "measure_amax_many",
      [](const nb::list& tensors, std::uintptr_t stream) {
        auto jobs = each<fa::Fp8Amax>(tensors, "tensors", [](const nb::tuple& t, const std::string& name) {
          return fa::Fp8Amax{elementwise_desc(t[0], name.c_str()), at<const void>(t[1]), at<float>(t[2])};
        });
        fa::measure_amax_many(jobs.data(), static_cast<int>(jobs.size()), stream_of(stream));
      },
      "tensors"_a, "stream"_a, "measure_amax of several tensors, each (x, data, amax).");
  m.def(
      "update_fp8_scales",
      [](const nb::list& updates, std::uintptr_t stream) {
        auto steps = each<fa::Fp8ScaleUpdate>(updates, "updates", [](const nb::tuple& t, const std::string& name) {
          fa::Fp8ScaleUpdate u;
          u.rule = parse_rule(nb::cast<std::string>(t[0]), name + ".rule");
          u.amax = at<const float>(t[1]);
          u.history_in = at<const float>(t[2]);
          u.history_out = at<float>(t[2]);
          u.length = nb::cast<std::int64_t>(t[3]);
          u.dtype = fa::parse_dtype(nb::cast<std::string>(t[4]), name + ".dtype");
          u.margin = nb::cast<int>(t[5]);
          u.scale = at<float>(t[6]);
          u.descale = at<float>(t[7]);
          u.descale_used = at<float>(t[8]);
          return u;
        });
        fa::update_fp8_scales(steps.data(), static_cast<int>(steps.size()), stream_of(stream));
      },
      "updates"_a, "stream"_a,
      "A step's scale updates in one launch, in order; each (rule, amax, history, length, dtype, margin, scale, "
      "descale, descale_used), rule \"from_amax\", \"delayed\" (the history in place) or \"keep\"; 0 for an "
      "address not used.");
}

}  // namespace

void bind_fp8_scales(nb::class_<fa::ForwardTensors>& forward, nb::class_<fa::BackwardTensors>& backward) {
  bind_scale_slots<fa::ForwardTensors>(forward);
  bind_scale_slots<fa::BackwardTensors>(backward);
}

void bind_fp8_kernels(nb::module_& m) {
  bind_many(m);
  m.def(
      "fp8_scale_slots",
      [](fa::Pass pass, bool kv_cache) {
        return pass == fa::Pass::forward ? slot_list<fa::Fp8ForwardScales>(kv_cache)
                                         : slot_list<fa::Fp8BackwardScales>(kv_cache);
      },
      "pass_"_a, "kv_cache"_a = false,
      "A pass's FP8 scaling slots (fusedattn/tensor_slots.h) as (name, role) pairs, role 'scale' (read) or "
      "'amax' (written), in the order the JAX custom call takes its scales and returns its amaxes: an FP8 "
      "call's, or with kv_cache=True those of an FP8 K/V cache beside 16-bit queries (its two descales).");
  m.def("fp8_max", [](const std::string& dtype) { return fa::fp8_max(fa::parse_dtype(dtype, "dtype")); }, "dtype"_a,
        "The largest finite value of an FP8 dtype (448 for E4M3, 57344 for E5M2).");
  m.def(
      "measure_amax",
      [](nb::handle view, std::uintptr_t data, std::uintptr_t amax, std::uintptr_t stream) {
        fa::measure_amax(elementwise_desc(view, "x"), pointer<const void>(data), pointer<float>(amax), stream_of(stream));
      },
      "x"_a, "data"_a, "amax"_a, "stream"_a, "*amax = max |x| on `stream` (NaN if any element is).");
  m.def(
      "quantize_fp8",
      [](nb::handle src, std::uintptr_t src_data, nb::handle dst, std::uintptr_t dst_data, std::uintptr_t scale,
         std::uintptr_t amax, std::uintptr_t stream) {
        fa::quantize_fp8(elementwise_desc(src, "src"), pointer<const void>(src_data), elementwise_desc(dst, "dst"),
                         pointer<void>(dst_data), pointer<const float>(scale), pointer<float>(amax), stream_of(stream));
      },
      "src"_a, "src_data"_a, "dst"_a, "dst_data"_a, "scale"_a, "amax"_a, "stream"_a,
      "dst = fp8(src * *scale) in one pass; *amax = max |src| too where amax is not 0.");
  m.def(
      "dequantize_fp8",
      [](nb::handle src, std::uintptr_t src_data, nb::handle dst, std::uintptr_t dst_data, std::uintptr_t descale,
         std::uintptr_t stream) {
        fa::dequantize_fp8(elementwise_desc(src, "src"), pointer<const void>(src_data), elementwise_desc(dst, "dst"),
                           pointer<void>(dst_data), pointer<const float>(descale), stream_of(stream));
      },
      "src"_a, "src_data"_a, "dst"_a, "dst_data"_a, "descale"_a, "stream"_a, "dst = src * *descale in one pass.");
  m.def(
      "scale_from_amax",
      [](std::uintptr_t amax, const std::string& dtype, int margin, std::uintptr_t scale, std::uintptr_t descale,
         std::uintptr_t stream) {
        fa::scale_from_amax(pointer<const float>(amax), fa::parse_dtype(dtype, "dtype"), margin, pointer<float>(scale),
                            pointer<float>(descale), stream_of(stream));
      },
      "amax"_a, "dtype"_a, "margin"_a, "scale"_a, "descale"_a, "stream"_a,
      "Current scaling: *scale = fp8_max / (*amax * 2^margin), *descale = 1 / *scale.");
  m.def(
      "update_delayed_scaling",
      [](std::uintptr_t history_in, std::uintptr_t history_out, std::int64_t length, std::uintptr_t amax,
         const std::string& dtype, int margin, std::uintptr_t scale, std::uintptr_t descale, std::uintptr_t stream) {
        fa::update_delayed_scaling(pointer<const float>(history_in), pointer<float>(history_out), length,
                                   pointer<const float>(amax), fa::parse_dtype(dtype, "dtype"), margin,
                                   pointer<float>(scale), pointer<float>(descale), stream_of(stream));
      },
      "history_in"_a, "history_out"_a, "length"_a, "amax"_a, "dtype"_a, "margin"_a, "scale"_a, "descale"_a, "stream"_a,
      "Delayed scaling's step: the history shifts and takes *amax; scale and descale from its largest amax.");
}

}  // namespace fusedattn::python
