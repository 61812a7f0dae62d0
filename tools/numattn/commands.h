// Each subcommand lives in its own cmd_<verb>.cpp and adds itself to the app here.
#pragma once

#include <CLI/CLI.hpp>

namespace numattn::cli {

void add_methods(CLI::App& app);
void add_run(CLI::App& app);
void add_bench(CLI::App& app);

}  // namespace numattn::cli
