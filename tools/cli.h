// tools/cli.h — the `fusedattn` command line: exit codes, the table that describes each command
// (its spec argument and its options), and the parsing, refusals and help text that follow from it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fusedattn::cli {

/// Exit codes: the shell tests and scripts depend on them.
enum Exit : int { kOk = 0, kFailed = 1, kUsage = 2, kNotSupported = 3, kNoGpu = 4, kError = 5 };

/// A mistake on the command line: exit 2 with the command's usage line.
struct UsageError {
  std::string message;
};

/// One --option of a command.
struct Option {
  const char* name;   ///< "--seed"
  const char* value;  ///< what follows it, as the help shows it ("N"); nullptr for a flag
  const char* help;
};

struct CommandLine;

/// One command, as the help shows it and the parser applies it: every option it takes, and only those.
struct Command {
  const char* name;
  const char* spec;     ///< "SPEC" (needed), "[SPEC]" (optional) or "" (none taken)
  const char* summary;  ///< one line, for `fusedattn --help`
  std::string details;  ///< the rest of `fusedattn NAME --help`, lines indented by two; may be empty
  std::vector<Option> options;
  int (*run)(const CommandLine&);
};

/// A parsed command line: the command, its spec string and the options given.
struct CommandLine {
  const Command* command = nullptr;
  std::string spec;
  std::map<std::string, std::string> options;  ///< "--seed" -> "42"; flags map to ""
  bool help = false;                           ///< --help or -h: print the command's help instead

  bool has(const std::string& name) const { return options.count(name) != 0; }
  /// The value of `name`, or `fallback` when it was not given.
  std::string text(const std::string& name, const std::string& fallback = "") const;
  /// The value of `name` as a non-negative integer; UsageError when it is not one.
  std::uint64_t count(const std::string& name, std::uint64_t fallback) const;
  /// The value of `name` as a number; UsageError when it is not one.
  double number(const std::string& name, double fallback) const;
};

/// Parses `args` (what follows the command's name) against `command`'s table. Refuses, with
/// UsageError, an option that `command` does not take (naming the ones it does), a missing value,
/// a second spec, and a spec given to a command that takes none. --help and -h anywhere win.
CommandLine parse_command_line(const Command& command, const std::vector<std::string>& args,
                               const std::vector<Command>& all);

/// "usage: fusedattn support SPEC [--pass forward|backward|both]"
std::string usage_line(const Command& command);
/// `fusedattn NAME --help`: the usage line, what the command does, and each option with its help.
std::string command_help(const Command& command);
/// `fusedattn --help`: every command's usage line and summary.
std::string program_help(const std::vector<Command>& all);

}  // namespace fusedattn::cli
