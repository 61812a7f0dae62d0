// libFuzzer target for the method spec-string parser: parse_spec, bind_params, create_method.
//
// Any input must either work or raise numattn::Error. What works must be canonical: the spec a
// method reports parses back to the same method (same spec), and each bound value is the value
// written, inside its declared range. Besides the registered methods, the input is bound to a
// synthetic schema with one parameter of each type, so that float, bool and string parameters
// are exercised before a registered method declares them. Seeds: fuzz/corpus/spec/.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "numattn/attention/registry.h"
#include "numattn/core/error.h"

namespace {

using numattn::MethodInfo;
using numattn::ParamSpec;
using numattn::ParamType;

const MethodInfo& synthetic() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "fuzz.synthetic";
    m.family = "exact";
    m.params = {
        ParamSpec{"n", ParamType::kInt, "4", -1000, 1000000, {}, ""},
        ParamSpec{"x", ParamType::kFloat, "0.5", 0, 1, {}, ""},
        ParamSpec{"big", ParamType::kFloat, "1", -1e300, 1e300, {}, ""},
        ParamSpec{"flag", ParamType::kBool, "false", 0, 0, {}, ""},
        ParamSpec{"kind", ParamType::kString, "a", 0, 0, {"a", "bb", "c_1"}, ""},
        ParamSpec{"tag", ParamType::kString, "t", 0, 0, {}, ""},
    };
    return m;
  }();
  return info;
}

[[noreturn]] void fail(const char* what, const std::string& a, const std::string& b) {
  std::fprintf(stderr, "spec_fuzz: %s\n  [%s]\n  [%s]\n", what, a.c_str(), b.c_str());
  std::abort();
}

// The bound values of `raw` under `info`, checked against what was written.
void check_bound(const MethodInfo& info, const numattn::ParsedSpec& ps) {
  numattn::ParamValues v;
  try {
    v = numattn::bind_params(info, ps.params);
  } catch (const numattn::Error&) {
    return;
  }
  const std::string canon = v.canonical();
  // Canonical text binds to itself.
  const numattn::ParsedSpec again = numattn::parse_spec(info.name + "(" + canon + ")");
  if (numattn::bind_params(info, again.params).canonical() != canon)
    fail("canonical parameters are not a fixed point", canon, "");
  for (const ParamSpec& p : info.params) {
    std::string written;
    for (const auto& [k, val] : ps.params)
      if (k == p.name) written = val;
    if (p.type == ParamType::kFloat) {
      const double x = v.get_float(p.name);
      if (!(x >= p.min && x <= p.max)) fail("bound float outside its range", p.name, canon);
      if (!written.empty() && x != std::stod(written))
        fail("bound float differs from the value written", written, canon);
    } else if (p.type == ParamType::kInt) {
      const auto x = v.get_int(p.name);
      if (x < p.min || x > p.max) fail("bound int outside its range", p.name, canon);
      if (!written.empty() && x != std::stoll(written))
        fail("bound int differs from the value written", written, canon);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  numattn::ParsedSpec ps;
  try {
    ps = numattn::parse_spec(spec);
  } catch (const numattn::Error&) {
    return 0;
  }
  check_bound(synthetic(), ps);
  for (const MethodInfo* info : numattn::list_methods()) check_bound(*info, ps);
  try {
    const auto m = numattn::create_method(spec);
    const std::string canon = m->spec();
    if (numattn::create_method(canon)->spec() != canon) fail("spec() is not canonical", spec, canon);
  } catch (const numattn::Error&) {
  }
  return 0;
}
