// Subcommand registry of the numattn CLI. Each cmd_<verb>.cpp defines an `add_<verb>` function
// and registers it with one line:
//   NUMATTN_COMMAND(30, add_bench);
// The number orders `numattn --help`. The objects are linked straight into the executable,
// so no registration can be dropped by the linker.
#pragma once

#include <CLI/CLI.hpp>

#include <vector>

namespace numattn::cli {

using AddCommand = void (*)(CLI::App&);

struct CommandEntry {
  int order;
  AddCommand add;
};

std::vector<CommandEntry>& command_table();

inline bool register_command(int order, AddCommand add) {
  command_table().push_back({order, add});
  return true;
}

}  // namespace numattn::cli

#define NUMATTN_COMMAND(order, fn) \
  static const bool numattn_cmd_registered_##fn = ::numattn::cli::register_command(order, &fn)
