// The subcommands of the `rpa` tool; each registers itself on the app.
#ifndef RPA_TOOLS_COMMANDS_H_
#define RPA_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>

namespace rpa::tools {

void AddDemoCommand(CLI::App& app);
void AddTuneCommands(CLI::App& app);  // tune, explain
void AddBenchCommand(CLI::App& app);  // bench

}  // namespace rpa::tools

#endif  // RPA_TOOLS_COMMANDS_H_
