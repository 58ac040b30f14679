// Internal: support answers from the pure policy alone, where cuDNN's own check cannot run — a
// device named by its target ("sm100") rather than present, or a process with no GPU to ask.
#pragma once

#include <string>

#include "fusedattn/support.h"

namespace fusedattn::detail {

/// The device a target names: "sm90" (or "sm_90") is SM 9.0, "sm100" SM 10.0, "sm86" SM 8.6; the
/// last digit is the minor version. Throws InvalidArgument (field "device") for another form, or for
/// an SM family the policy holds no rules for (it knows up to 10.x, and 12.x).
DeviceCaps device_target(const std::string& target);

/// check_support_policy's answer for `caps` as the whole answer, its policy_only saying so and why
/// cuDNN did not check: "policy for SM 9.0 with cuDNN 9.19.0 only, cuDNN's own check not run (<why>)".
/// A runtime cuDNN version of 0 (none loaded) is read as the compiled one, the version that a
/// process which loads it would run.
Support policy_only_answer(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, Versions versions,
                           const std::string& why);

}  // namespace fusedattn::detail
