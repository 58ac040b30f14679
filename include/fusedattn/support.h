// fusedattn/support.h — "is this supported, and if not, why": a pure policy over made-up or real
// devices and versions, returning every reason that applies.
#pragma once

#include <string>
#include <vector>

#include "fusedattn/spec.h"

namespace fusedattn {

/// Which pass of attention is asked about.
enum class Pass { forward, backward };
const char* to_string(Pass pass) noexcept;

/// What the policy needs to know about a GPU. Real values come from device_caps(); tests invent them.
struct DeviceCaps {
  int sm_major = 9, sm_minor = 0;
  int sm() const noexcept { return sm_major * 10 + sm_minor; }
};

/// Library versions, as cuDNN encodes them (9.19.0 -> 91900) and the frontend (1.32.0 -> 13200).
struct Versions {
  int cudnn_runtime = 0;   ///< cudnnGetVersion() of the loaded library
  int cudnn_compiled = 0;  ///< CUDNN_VERSION of the headers the library was built with
  int frontend = 0;        ///< CUDNN_FRONTEND_VERSION of the headers the graph layer was built with
};

/// "9.19.0" for 91900 (cuDNN 9 and the frontend: major·10000 + minor·100 + patch), "8.9.7" for 8907
/// (cuDNN 8: major·1000 + minor·100 + patch).
std::string version_text(int version);

/// One reason a configuration is not supported, as data.
struct Reason {
  std::string field;        ///< the spec field (or "device", "cudnn") that the rule is about
  std::string value;        ///< the value seen
  std::string requirement;  ///< what would be accepted
  std::string lifted_by;    ///< the cuDNN version or GPU that lifts the limit; empty if none does
  std::string to_string() const;
};

/// The answer: supported, or every reason not.
struct Support {
  std::vector<Reason> reasons;
  /// Set where the pure policy's answer stands alone because cuDNN's own check could not run
  /// (check_support for a named device, or with no GPU to ask): "policy for SM 9.0 with cuDNN
  /// 9.19.0 only, cuDNN's own check not run (no NVIDIA driver found)". Empty where cuDNN's check
  /// ran, or the policy's refusal settled it first, and in check_support_policy's own answer.
  std::string policy_only;
  /// Which kernels run a supported call, where cuDNN's check ran: "cuDNN", "cuDNN split decode, 32
  /// chunks of 4 pages", or "fusedattn decode kernel, 32 chunks of 256 keys merged" (its own decode
  /// kernel, src/support/decode_kernel_rule.h). Empty in a refusal and in a policy-only answer.
  std::string kernel;
  bool ok() const noexcept { return reasons.empty(); }
  /// "supported", or every reason on its own line; then policy_only, in parentheses, on its own line.
  std::string to_string() const;
};

/// The pure policy: no GPU, no cuDNN calls. Invalid specs are not its business (validate() throws
/// for those first). The cuDNN check after it is the final word (see plan_cache.h / attention.h).
Support check_support_policy(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions);

}  // namespace fusedattn
