// testing/reference_check.h — run one spec on the GPU and compare it with a reference that does
// not use cuDNN.
//
// The CLI (`fusedattn run`), the GPU tests and the benchmark all check numerics through this one
// implementation, so "passes" means the same thing everywhere: fresh random inputs, poisoned
// outputs, relative L2 error against float64 (CPU) or float32 (GPU) within DESIGN.md §8's tolerance.
#pragma once

#include "fusedattn/spec.h"
#include "testing/check_result.h"

namespace fusedattn::check {

/// Runs `spec` through fusedattn::forward (and backward) on the current device and compares every
/// output with the reference: the CPU float64 one up to about 3e8 multiply-adds per forward, the
/// GPU float32 one beyond. Ragged and paged specs are checked through their dense twins (twins.h).
/// Throws InvalidArgument (bad spec), NotSupported (every reason), CudnnError / CudaError /
/// SetupError; a numerical mismatch is not an exception but passed=false.
CheckResult check_against_reference(const AttentionSpec& spec, const CheckOptions& options);

}  // namespace fusedattn::check
