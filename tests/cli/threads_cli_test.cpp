// The CLI's thread flag and the OpenBLAS kernel restart, end to end.
#include <gtest/gtest.h>

#include <string>

#include "numattn/core/exec.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

std::string cli() { return NUMATTN_CLI_PATH; }

int run(const std::string& args, std::string* err) {
  const std::string errfile = test::temp_path("threads_cli_err.txt");
  std::string out;
  const int rc = test::run_command(cli() + " " + args + " 2>" + errfile, &out);
  test::run_command("cat " + errfile, err);
  return rc;
}

TEST(CliThreads, OutOfRangeCountsAreClearErrors) {
  for (const char* bad : {"100000", "-1", "-3", "abc"}) {
    std::string err;
    const int rc = run(std::string("run --method exact.flash --n 16 --d 8 --threads ") + bad, &err);
    EXPECT_NE(rc, 0) << bad;
    EXPECT_NE(err.find("error: --threads"), std::string::npos) << bad << ": " << err;
  }
  std::string err;
  EXPECT_EQ(run("run --method exact.flash --n 16 --d 8 --threads " + std::to_string(max_threads()),
                &err),
            0)
      << err;
}

TEST(CliThreads, HelpDoesNotRestartAndNamesTheRange) {
  std::string err, out;
  const int rc = test::run_command(cli() + " run --help 2>&1", &out);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("--threads"), std::string::npos);
  EXPECT_EQ(out.find("restarting"), std::string::npos) << out;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
