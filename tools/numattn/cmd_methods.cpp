#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/model/catalogue.h"

namespace numattn::cli {

void add_methods(CLI::App& app) {
  auto* sub = app.add_subcommand("methods", "list the registered attention methods (the catalogue)");
  auto format = std::make_shared<std::string>("md");
  sub->add_option("--format", *format, "md, csv or json")->check(CLI::IsMember({"md", "csv", "json"}));
  sub->callback([format] {
    const Row rows = method_catalogue(true);
    print_table(std::cout, std::vector<Row>(rows.begin(), rows.end()), parse_format(*format));
  });
}

NUMATTN_COMMAND(10, add_methods);

}  // namespace numattn::cli
