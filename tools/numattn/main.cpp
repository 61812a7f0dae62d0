#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>

#include "commands.h"
#include "common/blas_restart.h"
#include "numattn/core/error.h"

namespace numattn::cli {
std::vector<CommandEntry>& command_table() {
  static std::vector<CommandEntry> table;
  return table;
}
}  // namespace numattn::cli

int main(int argc, char** argv) {
  CLI::App app{"numattn: attention computed, approximated, transformed and studied numerically"};
  app.require_subcommand(1);
  // After a successful parse (so --help and flag errors answer at once), before the subcommand.
  app.parse_complete_callback([argv] { numattn::tools::restart_with_fast_blas_kernels(argv); });
  auto table = numattn::cli::command_table();
  std::sort(table.begin(), table.end(), [](auto& a, auto& b) { return a.order < b.order; });
  for (auto& e : table) e.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "error: %s\nRun with --help for more information.\n", e.what());
    return e.get_exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
