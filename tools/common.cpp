// What several commands share (common.h).
#include "common.h"

#include <iostream>

#include "fusedattn/attention.h"
#include "fusedattn/build_info.h"

namespace fusedattn::cli {

ValidatedSpec valid_spec(const CommandLine& line) {
  if (line.spec.empty()) throw UsageError{"'" + std::string(line.command->name) + "' needs a spec string"};
  return ValidatedSpec(parse_spec(line.spec));
}

std::string gpu_unavailable() {
  const BuildInfo info = build_info();
  if (info.device_count > 0 && info.gpu_unavailable_reason.empty()) return "";
  return info.gpu_unavailable_reason.empty() ? "no CUDA device visible" : info.gpu_unavailable_reason;
}

std::string quoted(const AttentionSpec& spec) { return "\"" + to_string(spec) + "\""; }

std::string cudnn_version(int version) { return version <= 0 ? "unknown" : version_text(version); }

std::vector<Pass> passes(const CommandLine& line) {
  const std::string which = line.text("--pass", "both");
  if (which == "forward") return {Pass::forward};
  if (which == "backward") return {Pass::backward};
  if (which == "both") return {Pass::forward, Pass::backward};
  throw UsageError{"--pass must be forward, backward or both, got '" + shown_value(which) + "'"};
}

void print_not_supported(const NotSupported& error, const AttentionSpec& spec) {
  std::cout << to_string(error.kind()) << ": " << error.what() << "\n  spec=" << quoted(spec) << "\n";
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace fusedattn::cli
