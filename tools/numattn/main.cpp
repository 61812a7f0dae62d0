#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <unistd.h>

#include "commands.h"
#include "numattn/core/blas.h"
#include "numattn/core/error.h"

namespace numattn::cli {
std::vector<CommandEntry>& command_table() {
  static std::vector<CommandEntry> table;
  return table;
}
}  // namespace numattn::cli

namespace {
// OpenBLAS picks its kernels when it loads, before main; if it fell back to generic kernels on
// a CPU it does not know, restart once with the right OPENBLAS_CORETYPE (blas.h). An explicit
// OPENBLAS_CORETYPE, or NUMATTN_KEEP_BLAS_CORE=1, is respected. If exec fails we go on with the
// slow kernels: results are the same, only the speed differs.
void fix_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("NUMATTN_KEEP_BLAS_CORE")) return;
  const char* core = numattn::blas::recommended_coretype();
  if (!core) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  execv("/proc/self/exe", argv);
}
}  // namespace

int main(int argc, char** argv) {
  fix_blas_kernels(argv);
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
