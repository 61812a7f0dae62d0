// The one splitter of spec lists: a comma inside a spec's parentheses belongs to the spec.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "numattn/attention/registry.h"
#include "numattn/core/error.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using Specs = std::vector<std::string>;

std::string error_of(std::string_view list, std::string_view seps = ",") {
  try {
    split_specs(list, seps);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SpecList, CommasInsideParenthesesStayInTheirSpec) {
  EXPECT_EQ(split_specs("lowrank.nystrom(landmarks=64,iters=2)"),
            (Specs{"lowrank.nystrom(landmarks=64,iters=2)"}));
  EXPECT_EQ(split_specs("sparse.window(left=32,sinks=4),exact.flash"),
            (Specs{"sparse.window(left=32,sinks=4)", "exact.flash"}));
  EXPECT_EQ(split_specs("exact.flash"), (Specs{"exact.flash"}));
  // Nesting: only depth 0 separates.
  EXPECT_EQ(split_specs("a.b(x=(1,2),y=3),c.d((,)),e.f"),
            (Specs{"a.b(x=(1,2),y=3)", "c.d((,))", "e.f"}));
}

TEST(SpecList, SpacesAroundItemsAreDroppedInsideKept) {
  EXPECT_EQ(split_specs("  exact.flash ,\tlowrank.nystrom( landmarks = 64 , iters=2 ) "),
            (Specs{"exact.flash", "lowrank.nystrom( landmarks = 64 , iters=2 )"}));
}

TEST(SpecList, SeparatorsAreTheCallersChoice) {
  EXPECT_EQ(split_specs("a.b(x=1,y=2);c.d,e.f", ",;"), (Specs{"a.b(x=1,y=2)", "c.d", "e.f"}));
  EXPECT_EQ(split_specs("a.b(x=1;y=2);c.d", ";"), (Specs{"a.b(x=1;y=2)", "c.d"}));
  // A separator not in the set is part of the item (the spec parser then judges it).
  EXPECT_EQ(split_specs("a.b,c.d", ";"), (Specs{"a.b,c.d"}));
}

TEST(SpecList, EmptyListsAndItemsAreRefusedWithThePosition) {
  EXPECT_NE(error_of("").find("empty spec list"), std::string::npos);
  EXPECT_NE(error_of("   ").find("empty spec list"), std::string::npos);
  for (const char* bad :
       {",exact.flash", "exact.flash,", "exact.flash,,exact.naive", "exact.flash, ,exact.naive"}) {
    const std::string e = error_of(bad);
    EXPECT_NE(e.find(std::string("spec list '") + bad + "': empty item at position"),
              std::string::npos)
        << e;
  }
  EXPECT_NE(error_of("a.b,,c.d").find("position 4"), std::string::npos) << error_of("a.b,,c.d");
  EXPECT_NE(error_of("a.b;;c.d", ",;").find("',' or ';'"), std::string::npos)
      << error_of("a.b;;c.d", ",;");
}

TEST(SpecList, UnbalancedParenthesesAreRefused) {
  const std::string open = error_of("lowrank.nystrom(landmarks=64,iters=2");
  EXPECT_NE(
      open.find("'lowrank.nystrom(landmarks=64,iters=2': the '(' at position 15 is never closed"),
      std::string::npos)
      << open;
  const std::string close = error_of("iters=2),exact.flash");
  EXPECT_NE(close.find("')' at position 7 closes no '('"), std::string::npos) << close;
  EXPECT_NE(error_of("a.b(x=1)),c.d").find("closes no '('"), std::string::npos);
  EXPECT_NE(error_of("a.b((x=1),c.d").find("never closed"), std::string::npos);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
