// fusedattn._core's FP8 part (fp8_bindings.cpp): called from the module's definition.
#pragma once

#include <nanobind/nanobind.h>

#include "fusedattn/attention.h"

namespace fusedattn::python {

/// The FP8 scaling tensors as address properties of ForwardTensors and BackwardTensors.
void bind_fp8_scales(nanobind::class_<ForwardTensors>& forward, nanobind::class_<BackwardTensors>& backward);
/// measure_amax, quantize_fp8, dequantize_fp8, scale_from_amax, update_delayed_scaling, fp8_max,
/// and fp8_scale_slots (each pass's scaling slots, in order).
void bind_fp8_kernels(nanobind::module_& m);

}  // namespace fusedattn::python
