// Support answers from the pure policy alone: the device a target names, and the answer that says
// cuDNN's own check did not run.
#include "support/policy_only.h"

#include <cctype>
#include <string>

#include "fusedattn/errors.h"
#include "support/rules.h"

namespace fusedattn::detail {
namespace {

constexpr const char* kTargetForm = "a target like sm80, sm90, sm100 or sm120 (\"sm\", optionally \"_\", the major "
                                    "and minor compute capability)";

bool all_digits(const std::string& text) {
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return !text.empty();
}

}  // namespace

DeviceCaps device_target(const std::string& target) {
  std::string digits = target.rfind("sm", 0) == 0 ? target.substr(2) : "";
  if (!digits.empty() && digits.front() == '_') digits.erase(0, 1);
  if (!all_digits(digits) || digits.size() < 2 || digits.size() > 3 || digits.front() == '0') {
    throw InvalidArgument("device", target, kTargetForm);
  }
  const int number = std::stoi(digits);
  const DeviceCaps caps{number / 10, number % 10};
  // SM 11.x has no rules of its own here: answering for it with the generic ones would guess.
  if (caps.sm_major == 11 || caps.sm_major > 12) {
    throw InvalidArgument("device", target,
                          "an SM family the support policy knows: up to 10.x (below 8.0 refused), or 12.x");
  }
  return caps;
}

Support policy_only_answer(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, Versions versions,
                           const std::string& why) {
  if (versions.cudnn_runtime == 0) versions.cudnn_runtime = versions.cudnn_compiled;
  Support support = check_support_policy(spec, pass, caps, versions);
  support.policy_only = "policy for " + sm_text(caps) + " with cuDNN " + version_text(versions.cudnn_runtime) +
                        " only, cuDNN's own check not run (" + why + ")";
  return support;
}

}  // namespace fusedattn::detail
