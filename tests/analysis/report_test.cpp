// Report writers: a number that is not finite is written the same way in every format, as a
// missing value (JSON null, empty md/csv cell), never as a string such as "inf".
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <limits>
#include <sstream>

#include "numattn/analysis/report.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

std::string print(const std::vector<Row>& rows, Format f, bool single = false) {
  std::ostringstream os;
  print_table(os, rows, f, single);
  return os.str();
}

TEST(Report, NonFiniteNumbersAreMissingValuesInEveryFormat) {
  const double inf = std::numeric_limits<double>::infinity();
  Row r;
  r["method"] = "m";
  r["rel_fro_error"] = inf;
  r["lse_max_abs_error"] = -inf;
  r["nmse"] = std::numeric_limits<double>::quiet_NaN();
  r["nested"] = Row::object({{"x", inf}, {"y", 2.5}});
  r["time_ms"] = 1.5;
  r["status"] = "failed: why";
  const auto j = nlohmann::json::parse(print({r}, Format::kJson, true));
  for (const char* k : {"rel_fro_error", "lse_max_abs_error", "nmse"}) EXPECT_TRUE(j[k].is_null()) << k;
  EXPECT_TRUE(j["nested"]["x"].is_null());
  EXPECT_EQ(j["nested"]["y"], 2.5);
  EXPECT_EQ(j["time_ms"], 1.5);
  EXPECT_EQ(print({r}, Format::kJson, true).find("inf"), std::string::npos);

  const std::string csv = print({r}, Format::kCsv);
  EXPECT_NE(csv.find("\nm,,,,"), std::string::npos) << csv;
  EXPECT_EQ(csv.find("inf"), std::string::npos) << csv;
  EXPECT_EQ(csv.find("nan"), std::string::npos) << csv;
  const std::string md = print({r}, Format::kMarkdown);
  EXPECT_NE(md.find("| m |  |  |  |"), std::string::npos) << md;
  EXPECT_EQ(cell_text(Row(inf)), cell_text(Row()));
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
