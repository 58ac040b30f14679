// tools/commands.h — each `fusedattn` command's entry point; the table in fusedattn.cpp names
// them, with their options and help.
#pragma once

#include "cli.h"

namespace fusedattn::cli {

int info_command(const CommandLine& line);            // support_commands.cpp
int support_command(const CommandLine& line);         // support_commands.cpp
int support_matrix_command(const CommandLine& line);  // support_commands.cpp
int run_command(const CommandLine& line);             // run_command.cpp
int bench_command(const CommandLine& line);           // bench_command.cpp
int warmup_command(const CommandLine& line);          // warmup_command.cpp
int demo_command(const CommandLine& line);            // demo_command.cpp

}  // namespace fusedattn::cli
