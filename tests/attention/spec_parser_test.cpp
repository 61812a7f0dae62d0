// Spec-string values are the identity of an experiment: a bound value is exactly the value
// written (found by fuzz/spec_fuzz.cpp: floats were rounded to 6 digits, which could also push a
// value outside its declared range).
#include <gtest/gtest.h>

#include "numattn/attention/registry.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

MethodInfo float_schema() {
  MethodInfo m;
  m.name = "test.floats";
  m.params = {ParamSpec{"x", ParamType::kFloat, "0.5", 0, 0.99999999, {}, ""}};
  return m;
}

TEST(SpecParser, FloatValuesAreBoundExactly) {
  const MethodInfo info = float_schema();
  for (const char* written : {"0.1234567891", "0.99999995", "1e-300", "0x1p-3", "0.5", "0"}) {
    const ParamValues v = bind_params(info, {{"x", written}});
    EXPECT_EQ(v.get_float("x"), std::stod(written)) << written << " -> " << v.canonical();
    EXPECT_LE(v.get_float("x"), 0.99999999);
    // The canonical text binds to itself.
    const ParsedSpec again = parse_spec("test.floats(" + v.canonical() + ")");
    EXPECT_EQ(bind_params(info, again.params).canonical(), v.canonical());
  }
  EXPECT_EQ(bind_params(info, {{"x", "0.25"}}).canonical(), "x=0.25");
  EXPECT_EQ(bind_params(info, {}).canonical(), "x=0.5");
  EXPECT_THROW(bind_params(info, {{"x", "1"}}), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
