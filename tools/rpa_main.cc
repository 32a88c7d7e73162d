// `rpa`: the command-line front of the library.
#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"rpa: ragged paged attention on CPUs"};
  app.require_subcommand(1);
  rpa::tools::AddDemoCommand(app);
  rpa::tools::AddTuneCommands(app);
  rpa::tools::AddBenchCommand(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
