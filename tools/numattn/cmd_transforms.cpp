// numattn transforms: the registered model transforms (transform/pipeline.h), as `methods` lists
// the attention methods.
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/model/catalogue.h"

namespace numattn::cli {

void add_transforms(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "transforms", "list the model transforms of --transform (ppl, bench-model, generate, convert, "
                    "capture, report; Python Model.load(transform=...)), composed with '|'");
  auto format = std::make_shared<std::string>("md");
  sub->add_option("--format", *format, "md, csv or json")->check(CLI::IsMember({"md", "csv", "json"}));
  sub->callback([format] {
    // JSON keeps the parameters structured; a table cell takes them as one line.
    const Row rows = transform_catalogue(*format != "json");
    print_table(std::cout, std::vector<Row>(rows.begin(), rows.end()), parse_format(*format));
  });
}

NUMATTN_COMMAND(11, add_transforms);

}  // namespace numattn::cli
