// numattn transforms: the registered model transforms (transform/pipeline.h), as `methods` lists
// the attention methods.
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/transform/pipeline.h"

namespace numattn::cli {

namespace {
std::string range_text(const ParamSpec& p) {
  switch (p.type) {
    case ParamType::kInt: return fmt::format("in [{:.0f}, {:.0f}]", p.min, p.max);
    case ParamType::kFloat: return fmt::format("in [{:g}, {:g}]", p.min, p.max);
    case ParamType::kBool: return "true or false";
    case ParamType::kString: {
      // Not '|': it separates the cells of a Markdown table (and the stages of a pipeline).
      std::string ch;
      for (const auto& c : p.choices) ch += (ch.empty() ? "" : ", ") + c;
      return ch.empty() ? "(text)" : "(one of " + ch + ")";
    }
  }
  return "";
}
}  // namespace

void add_transforms(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "transforms", "list the model transforms of --transform (ppl, bench-model, generate, convert, "
                    "capture, report; Python Model.load(transform=...)), composed with '|'");
  auto format = std::make_shared<std::string>("md");
  sub->add_option("--format", *format, "md, csv or json")->check(CLI::IsMember({"md", "csv", "json"}));
  sub->callback([format] {
    const bool json = *format == "json";
    std::vector<Row> rows;
    for (const MethodInfo* m : transform::list_transforms()) {
      Row r;
      r["name"] = m->name;
      r["family"] = m->family;
      if (json) {
        Row ps = Row::array();
        for (const ParamSpec& p : m->params) {
          Row e;
          e["name"] = p.name;
          e["type"] = p.type == ParamType::kInt ? "int" : p.type == ParamType::kFloat ? "float"
                      : p.type == ParamType::kBool ? "bool" : "string";
          e["default"] = p.default_value.empty() ? Row() : Row(p.default_value);
          e["required"] = p.default_value.empty();
          if (p.type == ParamType::kInt || p.type == ParamType::kFloat) {
            e["min"] = p.min;
            e["max"] = p.max;
          }
          if (!p.choices.empty()) e["choices"] = p.choices;
          e["doc"] = p.doc;
          ps.push_back(e);
        }
        r["parameters"] = ps;
      } else {
        std::string params;
        for (const ParamSpec& p : m->params)
          params += fmt::format("{}{}={} {}: {}", params.empty() ? "" : "; ", p.name,
                                p.default_value.empty() ? "(required)" : p.default_value, range_text(p), p.doc);
        r["parameters"] = params;
      }
      r["cost"] = m->time_complexity;
      r["summary"] = m->summary;
      r["citation"] = m->citation;
      rows.push_back(r);
    }
    print_table(std::cout, rows, parse_format(*format));
  });
}

NUMATTN_COMMAND(11, add_transforms);

}  // namespace numattn::cli
