// fusedattn._core's FP8 backward choice: which backward follows an FP8 forward, measured once per
// spec (fusedattn/fp8_backward_choice.h). A choice reaches Python as (chosen, fp8_ms, model_ms),
// chosen "fp8" or "model"; the model's dtype as its name ("bf16", "f16").
#include "fp8_backward_bindings.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <optional>
#include <string>
#include <tuple>

#include "fusedattn/fp8_backward_choice.h"
#include "fusedattn/spec.h"

namespace nb = nanobind;
namespace fa = fusedattn;
using namespace nb::literals;

namespace fusedattn::python {
namespace {

using ChoiceTuple = std::tuple<std::string, double, double>;

ChoiceTuple choice_tuple(const fa::Fp8BackwardChoice& choice) {
  return {fa::to_string(choice.chosen), choice.fp8_ms, choice.model_ms};
}

fa::DType model_dtype_of(const std::string& name) { return fa::parse_dtype(name, "model_dtype"); }

ChoiceTuple choose(const fa::AttentionSpec& spec, const std::string& model_dtype) {
  nb::gil_scoped_release unlocked;  // a measurement takes a second or so of GPU work
  return choice_tuple(fa::choose_fp8_backward(spec, model_dtype_of(model_dtype)));
}

std::optional<ChoiceTuple> known(const fa::AttentionSpec& spec, const std::string& model_dtype) {
  const auto choice = fa::known_fp8_backward_choice(spec, model_dtype_of(model_dtype));
  return choice ? std::optional<ChoiceTuple>(choice_tuple(*choice)) : std::nullopt;
}

}  // namespace

void bind_fp8_backward_choice(nb::module_& m) {
  const char* const choose_doc =
      "(chosen, fp8_ms, model_ms): which backward is faster after an FP8 forward of `spec` in a model of "
      "`model_dtype` (\"bf16\" or \"f16\"), \"fp8\" (cuDNN's FP8 backward with dO's quantization and the "
      "gradients' dequantization) or \"model\" (the backward in the model's dtype), with the median times "
      "(fp8_ms negative where the FP8 backward is not supported). Measured on stand-in data once per spec, "
      "model dtype and device, then from memory or the disk cache.";
  const char* const known_doc =
      "choose_fp8_backward's answer if this process holds it, without measuring; None otherwise.";
  // A ValidatedSpec (Config.spec) first, as check_support takes it; any other Spec is validated inside.
  m.def(
      "choose_fp8_backward",
      [](const fa::ValidatedSpec& spec, const std::string& model_dtype) { return choose(spec.spec(), model_dtype); },
      "spec"_a, "model_dtype"_a, choose_doc);
  m.def("choose_fp8_backward", &choose, "spec"_a, "model_dtype"_a, choose_doc);
  m.def(
      "known_fp8_backward_choice",
      [](const fa::ValidatedSpec& spec, const std::string& model_dtype) { return known(spec.spec(), model_dtype); },
      "spec"_a, "model_dtype"_a, known_doc);
  m.def("known_fp8_backward_choice", &known, "spec"_a, "model_dtype"_a, known_doc);
  m.def(
      "fp8_backward_report", [](const fa::ValidatedSpec& spec) { return fa::fp8_backward_report(spec.spec()); },
      "spec"_a);
  m.def("fp8_backward_report", &fa::fp8_backward_report, "spec"_a,
        "What check_support reports as fp8_backward: \"fp8\" or \"model\" where measured, \"not measured\", "
        "or \"\" for a spec that is not FP8 with per-tensor scaling.");
  m.def("clear_fp8_backward_choices", &fa::clear_fp8_backward_choices,
        "Forgets the FP8 backward choices held in memory (the disk cache keeps its own).");
  m.def("fp8_backward_measurements", &fa::fp8_backward_measurements,
        "How many FP8 backward choices this process has measured (not those from memory or disk).");
}

}  // namespace fusedattn::python
