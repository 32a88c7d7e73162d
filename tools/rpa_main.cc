// `rpa`: the command-line front of the library.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "rpa/dtype.h"
#include "rpa/kernels.h"

int main(int argc, char** argv) {
  CLI::App app{"rpa: ragged paged attention on CPUs"};
  // --version: the library's version and the kernels this CPU gets.
  app.set_version_flag("--version", [] {
    std::string s = std::string("rpa ") + RPA_VERSION_STRING + "\n";
    for (rpa::DType kv : {rpa::DType::kBF16, rpa::DType::kF8E4M3FN, rpa::DType::kF32}) {
      s += "kernels for " + std::string(rpa::ToString(kv)) + " K/V, " + rpa::DescribeKernels(kv);
    }
    return s;
  });
  app.require_subcommand(1);
  rpa::tools::AddDemoCommand(app);
  rpa::tools::AddTuneCommands(app);
  rpa::tools::AddBenchCommand(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
