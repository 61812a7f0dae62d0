#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>

#include "commands.h"
#include "numattn/core/blas.h"
#include "numattn/core/error.h"

namespace numattn::cli {
std::vector<CommandEntry>& command_table() {
  static std::vector<CommandEntry> table;
  return table;
}
}  // namespace numattn::cli

int main(int argc, char** argv) {
  numattn::blas::restart_with_fast_kernels(argv);
  CLI::App app{"numattn: attention computed, approximated, transformed and studied numerically"};
  app.require_subcommand(1);
  auto table = numattn::cli::command_table();
  std::sort(table.begin(), table.end(), [](auto& a, auto& b) { return a.order < b.order; });
  for (auto& e : table) e.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
