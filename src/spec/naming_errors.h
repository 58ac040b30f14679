// Internal: CUDA and cuDNN errors that name the call they came from, so any failure of a build or
// an execution can be pasted back into `fusedattn run` (DESIGN.md §7).
#pragma once

#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn::detail {

/// Runs `work`; a CudnnError or CudaError from it comes out again with " [<pass> <spec>]" after its
/// message (InvalidArgument names its field already). The handlers cost nothing when nothing throws.
template <class Work>
decltype(auto) naming_the_call(Pass pass, const AttentionSpec& spec, Work&& work) {
  const auto named = [&](const Error& error) {
    return std::string(error.what()) + " [" + to_string(pass) + " " + to_string(spec) + "]";
  };
  try {
    return work();
  } catch (const CudnnError& error) {
    throw CudnnError(named(error));
  } catch (const CudaError& error) {
    throw CudaError(named(error));
  }
}

}  // namespace fusedattn::detail
