// `fusedattn run SPEC`: the spec on the GPU against the reference, forward and backward.
#include <iostream>

#include "commands.h"
#include "common.h"
#include "fusedattn/attention.h"
#include "testing/fp8_check.h"
#include "testing/reference_check.h"

namespace fusedattn::cli {

int run_command(const CommandLine& line) {
  const AttentionSpec spec = valid_spec(line).spec();
  check::CheckOptions options;
  options.backward = !line.has("--no-backward");
  options.seed = line.count("--seed", 0);
  options.scale = line.number("--scale", options.scale);
  const std::string no_gpu = gpu_unavailable();
  if (!no_gpu.empty()) {
    std::cout << "no GPU: " << no_gpu << "  spec=" << quoted(spec) << "\n";
    return kNoGpu;
  }
  try {
    if (is_fp8(spec.q.dtype)) {  // against the dequantized inputs' reference, and BF16's result
      const check::Fp8CheckResult result = check::check_fp8_against_reference(spec, options.backward, options.seed);
      std::cout << result.to_string() << "\n";
      return result.passed ? kOk : kFailed;
    }
    const check::CheckResult result = check::check_against_reference(spec, options);
    std::cout << result.to_string() << "\n";
    return result.passed ? kOk : kFailed;
  } catch (const NotSupported& error) {
    print_not_supported(error, spec);
    return kNotSupported;
  }
}

}  // namespace fusedattn::cli
