// The command line against each command's table: one description drives what is accepted, what is
// refused (with the options the command does take) and what the help says.
#include "cli.h"

#include <cstdlib>

#include "fusedattn/errors.h"  // shown_value: long arguments are echoed cut, as the core's errors do

namespace fusedattn::cli {
namespace {

const char* const kSpecHelp = R"(SPEC is the one-line string every fusedattn error and log prints, for example
  "layout=bshd b=2 s=1024 h=16 d=128 causal"
(causal closes the window's right side: "... causal window=256,-1" is a causal sliding window of 256
keys, and a window with a right bound of 1 or more beside causal is refused.)
)";

const char* const kExitHelp = R"(Exit codes: 0 ok, 1 check failed / not supported, 2 usage or invalid spec, 3 not supported (run,
bench), 4 no GPU, 5 CUDA / cuDNN / setup error.
)";

constexpr std::size_t kHelpColumn = 34, kHelpWidth = 100;

// An option's help broken at spaces to fit kHelpWidth, its lines after the first at kHelpColumn.
std::string wrapped(const std::string& text) {
  std::string out;
  std::size_t line_start = 0;
  for (std::size_t word = 0; word < text.size();) {
    std::size_t end = text.find(' ', word);
    if (end == std::string::npos) end = text.size();
    const std::size_t width = kHelpColumn + (out.size() - line_start) + 1 + (end - word);  // with this word
    if (out.size() > line_start && width > kHelpWidth) {
      out += "\n" + std::string(kHelpColumn, ' ');
      line_start = out.size();
    } else if (out.size() > line_start) {
      out += ' ';
    }
    out += text.substr(word, end - word);
    word = end + 1;
  }
  return out;
}

bool is_help(const std::string& arg) { return arg == "--help" || arg == "-h"; }

const Option* find_option(const Command& command, const std::string& name) {
  for (const Option& option : command.options) {
    if (name == option.name) return &option;
  }
  return nullptr;
}

std::string option_usage(const Option& option) {
  return option.value ? std::string(option.name) + " " + option.value : std::string(option.name);
}

// "--pass forward|backward|both, --autotune", or "no options".
std::string option_list(const Command& command) {
  if (command.options.empty()) return "no options";
  std::string out;
  for (const Option& option : command.options) out += (out.empty() ? "" : ", ") + option_usage(option);
  return out;
}

// The option that `command` refuses, said so: unknown to every command, or another command's.
UsageError refusal(const Command& command, const std::string& name, const std::vector<Command>& all) {
  std::string owners;
  for (const Command& other : all) {
    if (find_option(other, name)) owners += (owners.empty() ? "" : ", ") + std::string(other.name);
  }
  const std::string takes = "'" + std::string(command.name) + "' takes " + option_list(command);
  if (owners.empty()) return UsageError{"unknown option " + shown_value(name) + "; " + takes};
  return UsageError{"option " + name + " does not apply to '" + command.name + "' (it is an option of " + owners +
                    "); " + takes};
}

}  // namespace

std::string CommandLine::text(const std::string& name, const std::string& fallback) const {
  auto found = options.find(name);
  return found == options.end() ? fallback : found->second;
}

std::uint64_t CommandLine::count(const std::string& name, std::uint64_t fallback) const {
  if (!has(name)) return fallback;
  const std::string value = text(name);
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || value[0] == '-') {
    throw UsageError{name + " needs a non-negative integer, got '" + shown_value(value) + "'"};
  }
  return parsed;
}

double CommandLine::number(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  const std::string value = text(name);
  char* end = nullptr;
  const double parsed = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0') throw UsageError{name + " needs a number, got '" + shown_value(value) + "'"};
  return parsed;
}

CommandLine parse_command_line(const Command& command, const std::vector<std::string>& args,
                               const std::vector<Command>& all) {
  CommandLine line;
  line.command = &command;
  for (const std::string& arg : args) {
    if (is_help(arg)) {  // asking for help is never a usage error, whatever else the line holds
      line.help = true;
      return line;
    }
  }
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') {  // a spec never starts with '-'; "-" alone is standard input
      if (*command.spec == '\0') {
        throw UsageError{"'" + std::string(command.name) + "' takes no spec, got '" + shown_value(arg) + "'"};
      }
      if (!line.spec.empty()) {
        throw UsageError{"unexpected argument '" + shown_value(arg) + "' (quote the spec as one argument)"};
      }
      line.spec = arg;
      continue;
    }
    const std::size_t equals = arg.find('=');  // --iters=5 as well as --iters 5
    const std::string name = arg.substr(0, equals);
    const Option* option = find_option(command, name);
    if (!option) throw refusal(command, name, all);
    if (!option->value) {
      if (equals != std::string::npos) throw UsageError{name + " is a flag and takes no value"};
      line.options[name] = "";
    } else if (equals != std::string::npos) {
      line.options[name] = arg.substr(equals + 1);
    } else {
      if (i + 1 >= args.size()) throw UsageError{name + " needs a value (" + option_usage(*option) + ")"};
      line.options[name] = args[++i];
    }
  }
  if (std::string(command.spec) == "SPEC" && line.spec.empty()) {
    throw UsageError{"'" + std::string(command.name) + "' needs a spec string"};
  }
  return line;
}

std::string usage_line(const Command& command) {
  std::string out = "usage: fusedattn " + std::string(command.name);
  if (*command.spec != '\0') out += " " + std::string(command.spec);
  for (const Option& option : command.options) out += " [" + option_usage(option) + "]";
  return out;
}

std::string command_help(const Command& command) {
  std::string out = usage_line(command) + "\n\n" + command.summary + "\n";
  out += command.details;
  out += "\noptions:\n";
  auto row = [&](const std::string& left, const std::string& help) {
    std::string padded = "  " + left;
    padded += padded.size() < kHelpColumn ? std::string(kHelpColumn - padded.size(), ' ')
                                          : "\n" + std::string(kHelpColumn, ' ');
    out += padded + wrapped(help) + "\n";
  };
  for (const Option& option : command.options) row(option_usage(option), option.help);
  row("-h, --help", "this help");
  if (*command.spec != '\0') out += std::string("\n") + kSpecHelp;
  return out + "\n" + kExitHelp;
}

std::string program_help(const std::vector<Command>& all) {
  std::string out = "usage: fusedattn COMMAND [SPEC] [options]    (fusedattn COMMAND --help: its options)\n\n";
  for (const Command& command : all) {
    std::string left = "  " + std::string(command.name);
    left += left.size() < 18 ? std::string(18 - left.size(), ' ') : " ";
    out += left + command.summary + "\n";
  }
  return out + "\n" + kSpecHelp + "\n" + kExitHelp;
}

}  // namespace fusedattn::cli
