#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "commands.h"
#include "numattn/core/blas_restart.h"
#include "numattn/core/cpu.h"
#include "numattn/core/error.h"
#include "numattn/quant/qgemv.h"

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
// Errors quote what the user gave; a 100k-character argument would be printed whole (and
// more than once). Any run of more than kLongRun non-blank characters is cut to its ends.
std::string elide_long_runs(const std::string& msg) {
  constexpr std::size_t kLongRun = 256, kHead = 96, kTail = 32;
  std::string out;
  std::size_t i = 0;
  while (i < msg.size()) {
    std::size_t j = i;
    while (j < msg.size() && msg[j] != ' ' && msg[j] != '\n' && msg[j] != '\t') ++j;
    if (j - i > kLongRun)
      out += msg.substr(i, kHead) + "…[" + std::to_string(j - i - kHead - kTail) + " characters]…" +
             msg.substr(j - kTail, kTail);
    else
      out.append(msg, i, j - i);
    if (j < msg.size()) out += msg[j];
    i = j + 1;
  }
  return out;
}

// `numattn --version`: the build, and the instruction-set path each kernel family runs here.
std::string version_text() {
  using namespace numattn;
  std::string s = std::string("numattn ") + NUMATTN_VERSION_STRING + " (compiled for " + NUMATTN_BUILD_ARCH + ")\n";
  s += "CPU paths this machine runs:";
  for (CpuPath p : runnable_cpu_paths()) s += std::string(" ") + cpu_path_name(p);
  const CpuPath path = default_cpu_path();
  s += std::string("\nlibrary path: ") + cpu_path_name(path) +
       " (NUMATTN_CPU_PATH=portable|avx2|avx512|avx512vnni forces one)\nkernel families:";
  for (const KernelPath& k : kernel_paths(path)) s += fmt::format("\n  {:<34}{}", k.family, cpu_path_name(k.path));
  return s;
}

// "numattn run --n 100": what a failure message names as the operation.
std::string command_line(int argc, char** argv) {
  std::string out = "numattn";
  for (int i = 1; i < argc; ++i) out += std::string(" ") + argv[i];
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"numattn: attention computed, approximated, transformed and studied numerically"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text, "Print the version and the CPU path of every kernel family, and exit");
  // After a successful parse (so --help and flag errors answer at once), before the subcommand.
  app.parse_complete_callback([argv] {
    numattn::restart_with_fast_blas_kernels(argv);
    numattn::check_quant_environment();  // a bad NUMATTN_CPU_PATH / NUMATTN_GEMV_SPLIT fails here
  });
  auto table = numattn::cli::command_table();
  std::sort(table.begin(), table.end(), [](auto& a, auto& b) { return a.order < b.order; });
  for (auto& e : table) e.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "error: %s\nRun with --help for more information.\n", elide_long_runs(e.what()).c_str());
    return e.get_exit_code();
  } catch (const numattn::OptionError& e) {
    std::fprintf(stderr, "error: %s: %s\n", flag_name(e.option()).c_str(),
                 elide_long_runs(flags_in(e.detail())).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    // Sizes are checked against available memory before the big allocations; one that still
    // fails is named by the command that asked (its flags carry the sizes).
    std::fprintf(stderr, "error: out of memory (std::bad_alloc) while running `%s`: reduce the sizes "
                 "or free memory\n", elide_long_runs(command_line(argc, argv)).c_str());
    return 1;
  } catch (const std::length_error& e) {
    std::fprintf(stderr, "error: out of memory (a size beyond what a buffer can hold: %s) while "
                 "running `%s`: reduce the sizes\n", e.what(), elide_long_runs(command_line(argc, argv)).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", elide_long_runs(e.what()).c_str());
    return 1;
  }
  return 0;
}
