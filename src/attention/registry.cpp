#include "numattn/attention/registry.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "attention/exact/flash.h"
#include "attention/method_def.h"
#include "numattn/attention/spec_syntax.h"

namespace numattn {

namespace {

std::string trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

bool is_ident(const std::string& s, bool allow_dot) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (allow_dot && c == '.');
  });
}

std::string describe_schema(const MethodInfo& info) {
  if (info.params.empty()) return info.name + " takes no parameters";
  std::string s = "valid keys of " + info.name + ": ";
  for (std::size_t i = 0; i < info.params.size(); ++i) {
    const ParamSpec& p = info.params[i];
    if (i) s += ", ";
    s += p.name;
    switch (p.type) {
      case ParamType::kInt: s += fmt::format(" (int in [{:g}, {:g}], default {})", p.min, p.max, p.default_value); break;
      case ParamType::kFloat: s += fmt::format(" (float in [{:g}, {:g}], default {})", p.min, p.max, p.default_value); break;
      case ParamType::kBool: s += fmt::format(" (true|false, default {})", p.default_value); break;
      case ParamType::kString: {
        std::string ch;
        for (auto& c : p.choices) ch += (ch.empty() ? "" : "|") + c;
        s += fmt::format(" ({}, default {})", ch.empty() ? "string" : ch, p.default_value);
      }
    }
  }
  return s;
}

// Canonical textual form of a value of type `t`; throws on a type error.
std::string normalise(const MethodInfo& info, const ParamSpec& ps, const std::string& v) {
  auto fail = [&](const std::string& why) {
    throw Error(fmt::format("spec {}: parameter {}={}: {}; {}", info.name, ps.name, v, why,
                            describe_schema(info)));
  };
  switch (ps.type) {
    case ParamType::kInt: {
      std::size_t pos = 0;
      long long x = 0;
      try {
        x = std::stoll(v, &pos);
      } catch (...) {
        fail("not an integer");
      }
      if (pos != v.size()) fail("not an integer");
      if (x < ps.min || x > ps.max) fail(fmt::format("out of range [{:g}, {:g}]", ps.min, ps.max));
      return std::to_string(x);
    }
    case ParamType::kFloat: {
      std::size_t pos = 0;
      double x = 0;
      try {
        x = std::stod(v, &pos);
      } catch (...) {
        fail("not a number");
      }
      if (pos != v.size() || !std::isfinite(x)) fail("not a finite number");
      if (x < ps.min || x > ps.max) fail(fmt::format("out of range [{:g}, {:g}]", ps.min, ps.max));
      return fmt::format("{}", x);  // shortest text that reads back as the same double
    }
    case ParamType::kBool:
      if (v == "true" || v == "1") return "true";
      if (v == "false" || v == "0") return "false";
      fail("not a bool (true|false)");
      return v;
    case ParamType::kString:
      if (!ps.choices.empty() && std::find(ps.choices.begin(), ps.choices.end(), v) == ps.choices.end())
        fail("not one of the allowed values");
      return v;
  }
  return v;
}

ParsedSpec parse_spec_impl(std::string_view spec, bool family_name) {
  ParsedSpec out;
  const std::string s = trim(spec);
  if (family_name)
    NUMATTN_CHECK(!s.empty(), "empty method spec (example: exact.flash or lowrank.nystrom(landmarks=64))");
  NUMATTN_CHECK(!s.empty(), "empty spec");
  const auto open = s.find('(');
  out.name = trim(std::string_view(s).substr(0, open));
  if (family_name) {
    // `auto` is short for auto.select, the one method named without its family.
    if (out.name == "auto") out.name = "auto.select";
    NUMATTN_CHECK(is_ident(out.name, true) && out.name.find('.') != std::string::npos,
                  "spec '{}': method name must look like family.name (e.g. exact.flash)", s);
  } else {
    NUMATTN_CHECK(is_ident(out.name, true), "spec '{}': '{}' is not a name (letters, digits, '_', '.')", s,
                  out.name);
  }
  if (open == std::string::npos) return out;
  NUMATTN_CHECK(s.back() == ')', "spec '{}': missing closing ')'", s);
  const std::string body = s.substr(open + 1, s.size() - open - 2);
  // Parameters are separated by the commas outside parentheses: a value may be a nested spec
  // (auto.causal(inner=lowrank.nystrom(landmarks=64,iters=4))), balanced.
  std::vector<std::size_t> commas;
  int depth = 0;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '(') {
      ++depth;
    } else if (body[i] == ')') {
      NUMATTN_CHECK(--depth >= 0, "spec '{}': unbalanced parentheses", s);
    } else if (body[i] == ',' && depth == 0) {
      commas.push_back(i);
    }
  }
  NUMATTN_CHECK(depth == 0, "spec '{}': unbalanced parentheses", s);
  commas.push_back(body.size());
  if (trim(body).empty()) return out;
  std::size_t start = 0;
  for (const std::size_t comma : commas) {
    const std::string item = trim(std::string_view(body).substr(start, comma - start));
    const auto eq = item.find('=');
    NUMATTN_CHECK(eq != std::string::npos, "spec '{}': parameter '{}' must be key=value", s, item);
    std::string key = trim(std::string_view(item).substr(0, eq));
    std::string val = trim(std::string_view(item).substr(eq + 1));
    NUMATTN_CHECK(is_ident(key, false), "spec '{}': bad parameter name '{}'", s, key);
    NUMATTN_CHECK(!val.empty(), "spec '{}': parameter '{}' has no value", s, key);
    for (auto& [k, _] : out.params)
      NUMATTN_CHECK(k != key, "spec '{}': parameter '{}' given twice", s, key);
    out.params.emplace_back(std::move(key), std::move(val));
    start = comma + 1;
  }
  return out;
}

}  // namespace

ParsedSpec parse_spec(std::string_view spec) { return parse_spec_impl(spec, true); }

ParsedSpec parse_spec_any_name(std::string_view spec) { return parse_spec_impl(spec, false); }

std::vector<std::string> split_specs(std::string_view list, std::string_view separators) {
  const std::string sep_names = [&] {
    std::string s;
    for (char c : separators) s += (s.empty() ? "'" : " or '") + std::string(1, c) + "'";
    return s;
  }();
  NUMATTN_CHECK(!trim(list).empty(),
                "empty spec list: give one or more method specs separated by {} (e.g. "
                "exact.flash{}lowrank.nystrom(landmarks=64))",
                sep_names, separators.empty() ? ',' : separators.front());
  std::vector<std::string> out;
  std::size_t start = 0, open_at = 0;
  int depth = 0;
  auto item = [&](std::size_t end) {
    std::string it = trim(list.substr(start, end - start));
    NUMATTN_CHECK(!it.empty(),
                  "spec list '{}': empty item at position {} (a leading, trailing or doubled "
                  "separator {}); remove it",
                  list, start, sep_names);
    out.push_back(std::move(it));
  };
  for (std::size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == '(') {
      if (depth++ == 0) open_at = i;
    } else if (c == ')') {
      NUMATTN_CHECK(depth > 0, "spec list '{}': ')' at position {} closes no '('", list, i);
      --depth;
    } else if (depth == 0 && separators.find(c) != std::string_view::npos) {
      item(i);
      start = i + 1;
    }
  }
  NUMATTN_CHECK(depth == 0, "spec list '{}': the '(' at position {} is never closed", list,
                open_at);
  item(list.size());
  return out;
}

std::vector<const MethodInfo*> list_methods() {
  std::vector<const MethodInfo*> v;
  for (const MethodEntry& e : registered_methods()) v.push_back(&e.describe());
  return v;
}

const MethodInfo* find_method(std::string_view name) {
  for (const MethodEntry& e : registered_methods())
    if (e.describe().name == name) return &e.describe();
  return nullptr;
}

ParamValues bind_params(const MethodInfo& info,
                        const std::vector<std::pair<std::string, std::string>>& raw) {
  std::map<std::string, std::string> values;
  for (const auto& kv : raw) {
    // Not a structured binding: clang before 16 cannot capture one in the lambda.
    const std::string &k = kv.first, &v = kv.second;
    auto it = std::find_if(info.params.begin(), info.params.end(),
                           [&](const ParamSpec& p) { return p.name == k; });
    NUMATTN_CHECK(it != info.params.end(), "spec {}: unknown parameter '{}'; {}", info.name, k,
                  describe_schema(info));
    values[k] = normalise(info, *it, v);
  }
  for (const ParamSpec& p : info.params)
    if (!values.count(p.name)) values[p.name] = normalise(info, p, p.default_value);
  return ParamValues(&info.params, std::move(values));
}

std::unique_ptr<AttentionMethod> create_method(std::string_view spec) {
  ParsedSpec ps = parse_spec(spec);
  for (const MethodEntry& e : registered_methods()) {
    const MethodInfo& info = e.describe();
    if (info.name == ps.name) return e.make(bind_params(info, ps.params));
  }
  std::string names;
  for (const MethodEntry& e : registered_methods()) names += (names.empty() ? "" : ", ") + e.describe().name;
  throw Error(fmt::format("unknown method '{}' (registered: {}; see `numattn methods`)", ps.name, names));
}

std::unique_ptr<AttentionMethod> create_exact_method() {
  return std::make_unique<FlashAttention>(bind_params(FlashAttention::describe(), {}));
}

}  // namespace numattn
