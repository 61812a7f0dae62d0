#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/attention/registry.h"

namespace numattn::cli {

namespace {
// Capabilities; a causal rule or window that the causal recursion supplies (method.h) is marked
// "(recursion)".
std::string caps_text(const AttentionMethod& m) {
  const Capabilities& c = m.info().caps;
  const bool rec = m.causal_recursion();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
  };
  add(c.exact, "exact");
  add(c.causal, "causal");
  add(!c.causal && rec, "causal(recursion)");
  add(c.gqa, "gqa");
  add(c.bool_mask, "bool-mask");
  add(c.additive_mask, "additive-mask");
  add(c.window, "window");
  add(!c.window && rec, "window(recursion)");
  add(c.lse, "lse");
  add(c.decode, "decode");
  add(c.randomized, "seeded");
  return s;
}
}  // namespace

void add_methods(CLI::App& app) {
  auto* sub = app.add_subcommand("methods", "list the registered attention methods (the catalogue)");
  auto format = std::make_shared<std::string>("md");
  sub->add_option("--format", *format, "md, csv or json")->check(CLI::IsMember({"md", "csv", "json"}));
  sub->callback([format] {
    std::vector<Row> rows;
    for (const MethodInfo* m : list_methods()) {
      Row r;
      const auto method = create_method(m->name);
      r["name"] = m->name;
      r["spec"] = method->spec();
      r["family"] = m->family;
      r["target"] = method->target().name();
      std::string params;
      for (const ParamSpec& p : m->params)
        params += (params.empty() ? "" : "; ") + p.name + "=" + p.default_value + ": " + p.doc;
      r["parameters"] = params;
      r["capabilities"] = caps_text(*method);
      r["time"] = m->time_complexity;
      r["memory"] = m->memory_complexity;
      r["summary"] = m->summary;
      r["citation"] = m->citation;
      rows.push_back(r);
    }
    print_table(std::cout, rows, parse_format(*format));
  });
}

NUMATTN_COMMAND(10, add_methods);

}  // namespace numattn::cli
