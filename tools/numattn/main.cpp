#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "common/blas_restart.h"
#include "numattn/core/error.h"

namespace numattn::cli {
std::vector<CommandEntry>& command_table() {
  static std::vector<CommandEntry> table;
  return table;
}
}  // namespace numattn::cli

namespace {
// The library names an option as its field (OptionError); every flag is that name with dashes.
std::string flag_name(std::string option) {
  std::replace(option.begin(), option.end(), '_', '-');
  return "--" + option;
}
// Other options a library message mentions are written in backquotes (`allow_long_ctx`).
std::string flags_in(const std::string& detail) {
  std::string out;
  std::size_t pos = 0;
  for (std::size_t a; (a = detail.find('`', pos)) != std::string::npos;) {
    const std::size_t b = detail.find('`', a + 1);
    if (b == std::string::npos) break;
    out += detail.substr(pos, a - pos) + flag_name(detail.substr(a + 1, b - a - 1));
    pos = b + 1;
  }
  return out + detail.substr(pos);
}
}  // namespace

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
  } catch (const numattn::OptionError& e) {
    std::fprintf(stderr, "error: %s: %s\n", flag_name(e.option()).c_str(),
                 flags_in(e.detail()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
