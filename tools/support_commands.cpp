// `fusedattn info`, `support` and `support-matrix`: what this build and this GPU can do.
#include <fstream>
#include <iostream>

#include "commands.h"
#include "common.h"
#include "progress.h"
#include "support_matrix.h"
#include "fusedattn/attention.h"
#include "fusedattn/build_info.h"

namespace fusedattn::cli {
namespace {

void print_verdict(const std::string& label, const Support& support, const AttentionSpec& spec) {
  std::cout << label << ": " << (support.ok() ? "supported" : "not supported") << "  spec=" << quoted(spec) << "\n";
  for (const Reason& reason : support.reasons) std::cout << "  - " << reason.to_string() << "\n";
}

// Without a GPU: the pure policy for an SM 9.0 device, and it says so.
int support_without_gpu(const AttentionSpec& spec, const std::vector<Pass>& asked, const std::string& no_gpu) {
  std::cout << "no GPU: showing the policy for SM 9.0 only, cuDNN's own check not run (" << no_gpu << ")\n";
  Versions versions = current_versions();
  // Without a loadable cuDNN the runtime version reads 0; ask the policy about the compiled one.
  if (versions.cudnn_runtime == 0) versions.cudnn_runtime = versions.cudnn_compiled;
  std::cout << "policy inputs: SM 9.0, cuDNN " << cudnn_version(versions.cudnn_runtime) << "\n";
  bool all_ok = true;
  for (Pass pass : asked) {
    const Support policy = check_support(spec, pass, "sm90");  // the policy alone, as the library answers
    print_verdict(to_string(pass), policy, spec);
    all_ok = all_ok && policy.ok();
  }
  return all_ok ? kOk : kFailed;
}

}  // namespace

int info_command(const CommandLine&) {
  std::cout << build_info().to_string() << "\n";
  return kOk;
}

int support_command(const CommandLine& line) {
  const std::vector<Pass> asked = passes(line);
  const ValidatedSpec valid = valid_spec(line);
  const AttentionSpec& spec = valid.spec();
  const std::string no_gpu = gpu_unavailable();
  if (!no_gpu.empty()) return support_without_gpu(spec, asked, no_gpu);
  const DeviceCaps caps = current_device_caps();
  const Versions versions = current_versions();
  std::cout << "device: SM " << caps.sm_major << "." << caps.sm_minor << ", cuDNN "
            << cudnn_version(versions.cudnn_runtime) << "\n";
  bool all_ok = true;
  for (Pass pass : asked) {
    const std::string name = to_string(pass);
    print_verdict(name + " policy", check_support_policy(spec, pass, caps, versions), spec);
    // The final word: the policy again plus cuDNN's own check (which builds and caches the plan).
    const Support full = check_support(valid, pass);
    print_verdict(name, full, spec);
    all_ok = all_ok && full.ok();
  }
  return all_ok ? kOk : kFailed;
}

int support_matrix_command(const CommandLine& line) {
  const bool with_cudnn = gpu_unavailable().empty();
  // With a GPU each combination builds its plans: minutes, hence the progress lines.
  namespace tools = fusedattn::tools;
  const std::size_t total =
      tools::feature_entries(tools::kReportSize).size() + tools::layout_entries(tools::kReportSize).size();
  Progress progress("support-matrix", "combinations", total);
  const std::string report =
      tools::support_matrix_markdown(with_cudnn, [&](std::size_t done, std::size_t) { progress.update(done); });
  progress.finish();
  if (!line.has("--out")) {
    std::cout << report;
    return kOk;
  }
  const std::string path = line.text("--out");
  std::ofstream file(path);
  file << report;
  if (!file) throw UsageError{"cannot write " + path};
  std::cout << "wrote " << path << "\n";
  return kOk;
}

}  // namespace fusedattn::cli
