#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "commands.h"
#include "numattn/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"numattn: attention computed, approximated, transformed and studied numerically"};
  app.require_subcommand(1);
  numattn::cli::add_methods(app);
  numattn::cli::add_run(app);
  numattn::cli::add_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const numattn::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
