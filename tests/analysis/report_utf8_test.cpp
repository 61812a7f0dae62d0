// Tables hold arbitrary bytes (paths, prompts, GGUF metadata): JSON output replaces bytes that
// are not UTF-8 instead of throwing json.exception.type_error.316.
#include <gtest/gtest.h>

#include <sstream>

#include "numattn/analysis/report.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

TEST(Report, InvalidUtf8NeverAbortsAnyFormat) {
  Row r;
  r["prompt"] = std::string("caf\xc3", 4);  // cut in the middle of "é"
  r["list"] = std::vector<std::string>{"\xff", "ok"};
  for (Format f : {Format::kJson, Format::kMarkdown, Format::kCsv}) {
    std::ostringstream os;
    ASSERT_NO_THROW(print_table(os, {r}, f, true));
    EXPECT_NE(os.str().find("\xef\xbf\xbd"), std::string::npos) << os.str();  // U+FFFD
  }
  std::ostringstream os;
  print_table(os, {r}, Format::kJson, true);
  const Row back = Row::parse(os.str());
  EXPECT_EQ(back["prompt"], "caf\xef\xbf\xbd");
  EXPECT_EQ(back["list"][0], "\xef\xbf\xbd");
  EXPECT_EQ(dump_json(Row("a\x80"
                          "b")),
            "\"a\xef\xbf\xbd"
            "b\"");
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
