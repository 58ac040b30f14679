// tools/fusedattn.cpp — the `fusedattn` command: the table of commands (each one's spec argument,
// options and help, from which parsing, refusals and help text follow) and main, which maps every
// error to its exit code.
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "fusedattn/autotune.h"
#include "fusedattn/errors.h"

namespace fa = fusedattn;
using namespace fusedattn::cli;

namespace {

const Option kPass{"--pass", "forward|backward|both", "the passes to ask about (default both)"};
const Option kAutotune{"--autotune", nullptr,
                       "time every plan cuDNN offers and keep the fastest, remembered in the disk cache "
                       "(FUSEDATTN_PLAN_DIR, default ~/.cache/fusedattn/plans; =off turns it off)"};

const char* const kProgressNote =
    "  Progress goes to stderr (\"warmup: 37/412 plans (12 s)\"), a line every FUSEDATTN_PROGRESS_SECONDS\n"
    "  (default 2; 0: every item; off: none); stdout holds the result alone.\n";

const std::vector<Command>& commands() {
  static const std::vector<Command> all = {
      {"info", "", "build, cuDNN and GPU information", "", {}, info_command},
      {"support", "SPEC", "is SPEC supported here, and if not, every reason (exit 0 yes, 1 no)",
       "  Without a GPU: the pure policy for an SM 9.0 device, and it says that cuDNN's own check did not run.\n",
       {kPass},
       support_command},
      {"run", "SPEC", "run SPEC on the GPU and compare with a reference (exit 0 pass, 1 fail)",
       "  FP8 specs: BF16 inputs quantized first, compared with the dequantized reference and with BF16.\n",
       {{"--no-backward", nullptr, "the forward alone"},
        {"--seed", "N", "the random inputs' seed (default 0)"},
        {"--scale", "X", "the attention scale (default 1/sqrt(d_qk))"},
        kAutotune},
       run_command},
      {"bench", "SPEC", "kernel time, TFLOP/s, host time per call and plan build time of SPEC",
       "  Each pass timed with CUDA events; an FP8 spec is timed beside BF16 on the same inputs.\n"
       + std::string(kProgressNote),
       {{"--iters", "N", "calls timed per pass, their median printed (default 20)"}, kAutotune},
       bench_command},
      {"warmup", "[SPEC]", "build the plans of SPEC and of each line of FILE in parallel into the disk cache",
       "  Prints the time each plan took (restored, built or tuned) and the disk cache's counters.\n"
       + std::string(kProgressNote),
       {{"--file", "FILE", "one spec a line ('-': standard input; blank lines and # comments skipped)"},
        {"--buckets", nullptr, "each ragged spec's buckets too (every one its batches can reach)"},
        kPass,
        {"--threads", "N", "build threads (default the hardware's, at most 8)"},
        kAutotune},
       warmup_command},
      {"demo", "", "a checked forward+backward on a standard problem (CPU reference only without a GPU)", "", {},
       demo_command},
      {"support-matrix", "", "check_support over features x masks x head dims x layouts x dtypes, as markdown",
       "  Without a GPU: the pure policy for SM 9.0, and the report says so.\n" + std::string(kProgressNote),
       {{"--out", "FILE", "write the report to FILE instead of stdout"}},
       support_matrix_command},
  };
  return all;
}

const Command* find_command(const std::string& name) {
  for (const Command& command : commands()) {
    if (name == command.name) return &command;
  }
  return nullptr;
}

int dispatch(const std::vector<std::string>& args) {
  if (args.empty()) throw UsageError{"missing command"};
  const std::string& name = args[0];
  if (name == "--help" || name == "-h" || name == "help") {
    if (args.size() < 2) {
      std::cout << program_help(commands());
      return kOk;
    }
    const Command* command = find_command(args[1]);  // `fusedattn help support`
    if (!command) throw UsageError{"unknown command '" + fa::shown_value(args[1]) + "'"};
    std::cout << command_help(*command);
    return kOk;
  }
  const Command* command = find_command(name);
  if (!command) throw UsageError{"unknown command '" + fa::shown_value(name) + "'"};
  const CommandLine line =
      parse_command_line(*command, std::vector<std::string>(args.begin() + 1, args.end()), commands());
  if (line.help) {
    std::cout << command_help(*command);
    return kOk;
  }
  if (line.has("--autotune")) fa::set_autotune(true);
  return command->run(line);
}

// The usage line of the command named first, or the program's when there is none.
std::string usage_for(const std::vector<std::string>& args) {
  const Command* command = args.empty() ? nullptr : find_command(args[0]);
  if (command) return usage_line(*command) + "\n(fusedattn " + command->name + " --help: its help)";
  std::string names;
  for (const Command& each : commands()) names += (names.empty() ? "" : ", ") + std::string(each.name);
  return "usage: fusedattn COMMAND [SPEC] [options]; commands: " + names + " (fusedattn --help: what each does)";
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return dispatch(args);
  } catch (const UsageError& error) {
    std::cerr << "fusedattn: " << error.message << "\n" << usage_for(args) << "\n";
    return kUsage;
  } catch (const fa::InvalidArgument& error) {
    std::cerr << fa::to_string(error.kind()) << ": " << error.what() << "\n";
    return kUsage;
  } catch (const fa::NotSupported& error) {
    // The message lists every reason, and the spec.
    std::cout << fa::to_string(error.kind()) << ": " << error.what() << "\n";
    return kNotSupported;
  } catch (const fa::Error& error) {
    std::cerr << fa::to_string(error.kind()) << ": " << error.what() << "\n";
    return kError;
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return kError;
  }
}
