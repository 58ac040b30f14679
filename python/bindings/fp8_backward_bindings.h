// fusedattn._core's part for the FP8 backward's choice (fp8_backward_bindings.cpp).
#pragma once

#include <nanobind/nanobind.h>

namespace fusedattn::python {

/// choose_fp8_backward, known_fp8_backward_choice, fp8_backward_report, clear_fp8_backward_choices and
/// fp8_backward_measurements (fusedattn/fp8_backward_choice.h).
void bind_fp8_backward_choice(nanobind::module_& m);

}  // namespace fusedattn::python
