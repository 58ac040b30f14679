// tools/common.h — what several `fusedattn` commands share: the spec argument, the GPU probe, the
// passes asked for, and the way a spec and a refusal are printed.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "cli.h"
#include "fusedattn/errors.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn::cli {

/// The command's spec, parsed and validated: InvalidArgument (exit 2) names the field.
ValidatedSpec valid_spec(const CommandLine& line);

/// Empty when a GPU can be used; otherwise why not.
std::string gpu_unavailable();

/// The spec string in double quotes, ready to paste back into `fusedattn run`.
std::string quoted(const AttentionSpec& spec);

/// "9.19.0", or "unknown" where no version was read.
std::string cudnn_version(int version);

/// --pass forward|backward|both (both when not given).
std::vector<Pass> passes(const CommandLine& line);

/// A refusal on stdout, the message (every reason) and the spec, so the output is a repro.
void print_not_supported(const NotSupported& error, const AttentionSpec& spec);

/// Host milliseconds since `start`.
double ms_since(std::chrono::steady_clock::time_point start);

}  // namespace fusedattn::cli
