#include "numattn/model/catalogue.h"

#include <fmt/format.h>

#include "numattn/attention/registry.h"
#include "numattn/transform/pipeline.h"

namespace numattn {

namespace {

using Json = nlohmann::ordered_json;

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

bool numeric(const ParamSpec& p) { return p.type == ParamType::kInt || p.type == ParamType::kFloat; }

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

// Methods and transforms spell the string type differently ("str" is Python's name, which
// numattn.methods() has always given; `numattn transforms --format json` says "string").
const char* type_name(ParamType t, const char* string_name) {
  switch (t) {
    case ParamType::kInt: return "int";
    case ParamType::kFloat: return "float";
    case ParamType::kBool: return "bool";
    case ParamType::kString: return string_name;
  }
  return "?";
}

}  // namespace

Json method_description(const MethodInfo& m) {
  const auto method = create_method(m.name);
  Json d;
  d["name"] = m.name;
  d["spec"] = method->spec();
  d["family"] = m.family;
  d["summary"] = m.summary;
  d["citation"] = m.citation;
  d["time_complexity"] = m.time_complexity;
  d["memory_complexity"] = m.memory_complexity;
  d["target"] = method->target().name();
  Json params = Json::array();
  for (const ParamSpec& p : m.params) {
    Json pd;
    pd["name"] = p.name;
    pd["type"] = type_name(p.type, "str");
    pd["default"] = p.default_value;
    if (numeric(p)) {
      pd["min"] = p.min;
      pd["max"] = p.max;
    }
    if (!p.choices.empty()) pd["choices"] = p.choices;
    pd["doc"] = p.doc;
    params.push_back(std::move(pd));
  }
  d["params"] = std::move(params);
  const Capabilities& c = m.caps;
  d["capabilities"] = {{"exact", c.exact},
                       {"causal", c.causal},
                       {"gqa", c.gqa},
                       {"bool_mask", c.bool_mask},
                       {"additive_mask", c.additive_mask},
                       {"window", c.window},
                       {"lse", c.lse},
                       {"decode", c.decode},
                       {"dk_ne_dv", c.dk_ne_dv},
                       {"strided", c.strided},
                       {"deterministic", c.deterministic},
                       {"randomized", c.randomized}};
  return d;
}

Json method_catalogue_row(const MethodInfo& m) {
  const auto method = create_method(m.name);
  Json r;
  r["name"] = m.name;
  r["spec"] = method->spec();
  r["family"] = m.family;
  r["target"] = method->target().name();
  std::string params;
  for (const ParamSpec& p : m.params)
    params += (params.empty() ? "" : "; ") + p.name + "=" + p.default_value + ": " + p.doc;
  r["parameters"] = params;
  r["capabilities"] = caps_text(*method);
  r["time"] = m.time_complexity;
  r["memory"] = m.memory_complexity;
  r["summary"] = m.summary;
  r["citation"] = m.citation;
  return r;
}

Json transform_description(const MethodInfo& m) {
  Json r;
  r["name"] = m.name;
  r["family"] = m.family;
  Json ps = Json::array();
  for (const ParamSpec& p : m.params) {
    Json e;
    e["name"] = p.name;
    e["type"] = type_name(p.type, "string");
    e["default"] = p.default_value.empty() ? Json() : Json(p.default_value);
    e["required"] = p.default_value.empty();
    if (numeric(p)) {
      e["min"] = p.min;
      e["max"] = p.max;
    }
    if (!p.choices.empty()) e["choices"] = p.choices;
    e["doc"] = p.doc;
    ps.push_back(std::move(e));
  }
  r["parameters"] = std::move(ps);
  r["cost"] = m.time_complexity;
  r["summary"] = m.summary;
  r["citation"] = m.citation;
  return r;
}

Json transform_catalogue_row(const MethodInfo& m) {
  Json r = transform_description(m);
  std::string params;
  for (const ParamSpec& p : m.params)
    params += fmt::format("{}{}={} {}: {}", params.empty() ? "" : "; ", p.name,
                          p.default_value.empty() ? "(required)" : p.default_value, range_text(p), p.doc);
  r["parameters"] = params;
  return r;
}

Json method_catalogue(bool as_rows) {
  Json out = Json::array();
  for (const MethodInfo* m : list_methods()) out.push_back(as_rows ? method_catalogue_row(*m) : method_description(*m));
  return out;
}

Json transform_catalogue(bool as_rows) {
  Json out = Json::array();
  for (const MethodInfo* m : transform::list_transforms())
    out.push_back(as_rows ? transform_catalogue_row(*m) : transform_description(*m));
  return out;
}

}  // namespace numattn
