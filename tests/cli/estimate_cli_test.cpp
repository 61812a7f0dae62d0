// The estimate columns of run and bench (--est-rows), `numattn advise`, and the small version of
// scripts/validate_estimate.py (coverage and factor-2 rate of the estimate over CLI runs).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using nlohmann::json;

std::string cli() { return NUMATTN_CLI_PATH; }

json run_json(const std::string& args) {
  std::string out;
  const int rc = test::run_command(cli() + " " + args + " 2>/dev/null", &out);
  EXPECT_EQ(rc, 0) << args << "\n" << out;
  return rc == 0 ? json::parse(out) : json();
}

TEST(EstimateCli, RunCarriesTheEstimateAndItsBound) {
  // Every row checked (4 × 256 rows), so rel_fro_error is the true error.
  const json j = run_json("run --method 'sparse.window(left=16,right=16,sinks=0)' --n 256 --heads 4 --d 32 "
                          "--seed 3 --format json --threads 2 --est-rows 32");
  for (const char* k : {"est_rel_error", "est_rel_error_hi", "est_rows", "est_level"})
    ASSERT_TRUE(j.contains(k)) << k << " missing in " << j.dump();
  EXPECT_EQ(j["est_rows"], 32);
  EXPECT_EQ(j["est_level"], 0.95);
  const double truth = j["rel_fro_error"], est = j["est_rel_error"], hi = j["est_rel_error_hi"];
  EXPECT_GE(hi, est);
  EXPECT_GT(est, truth / 2) << j.dump();
  EXPECT_LT(est, truth * 2) << j.dump();
  // Exact methods too: an estimate at rounding level.
  const json x = run_json("run --method exact.flash --n 128 --heads 2 --d 16 --format json --est-rows 8");
  EXPECT_LT(x["est_rel_error"].get<double>(), 1e-5);
  // 0 turns it off.
  EXPECT_FALSE(run_json("run --method exact.flash --n 64 --d 8 --format json --est-rows 0").contains("est_rel_error"));
}

TEST(EstimateCli, BenchRowsCarryTheEstimate) {
  std::string out;
  ASSERT_EQ(test::run_command(cli() + " bench --method sparse.topk --n 128 --heads 2 --d 16 --reps 1 "
                                      "--gemm-size 64 --format csv --est-rows 16 2>/dev/null", &out), 0) << out;
  EXPECT_NE(out.find("est_rel_error,est_rel_error_hi,est_rows,est_level"), std::string::npos) << out;
}

TEST(EstimateCli, AdvisePrintsTheChoiceAndEveryCandidate) {
  const json j = run_json("advise --tol 0.05 --n 256 --heads 2 --d 32 --causal bottom-right --reps 1 "
                          "--method sparse.window --method sparse.topk --format json --threads 2");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["tol"], 0.05);
  EXPECT_EQ(j["baseline"]["spec"], "exact.flash(block_q=64,block_k=256,split_kv=0,key_lanes=-1)");
  ASSERT_TRUE(j["candidates"].is_array());
  EXPECT_GE(j["candidates"].size(), 2u);  // each method's default, then its budget search's probes
  bool exact_seen = false;
  for (const json& c : j["candidates"]) {
    for (const char* k : {"spec", "kind", "meets", "seconds", "speedup_vs_exact", "est_rel_error", "est_rel_error_hi", "status"})
      EXPECT_TRUE(c.contains(k)) << k;
    exact_seen |= c["kind"] == "exact";
    if (c["meets"].get<bool>()) {
      EXPECT_LE(c["est_rel_error_hi"].get<double>(), 0.05);
    }
  }
  EXPECT_TRUE(exact_seen) << "a window over every key is reported as exact";
  if (!j["choice"].is_null()) {
    EXPECT_TRUE(j["choice"]["meets"].get<bool>());
  }
  // Tolerance 0: none, said in words in md.
  std::string out;
  ASSERT_EQ(test::run_command(cli() + " advise --tol 0 --n 128 --heads 2 --d 16 --reps 1 --method sparse.topk 2>&1", &out), 0);
  EXPECT_NE(out.find("choice: none"), std::string::npos) << out;
  // --tol is required; est rows below 2 give no bound.
  EXPECT_NE(test::run_command(cli() + " advise --n 64 2>/dev/null", &out), 0);
  EXPECT_NE(test::run_command(cli() + " advise --tol 0.1 --est-rows 1 --n 64 2>&1", &out), 0);
  EXPECT_NE(out.find("est-rows"), std::string::npos) << out;
}

TEST(EstimateCli, SmallValidationOfTheStatistic) {
  std::string out;
  if (test::run_command("python3 -c 'import sys; sys.exit(0)' 2>/dev/null", &out) != 0)
    GTEST_SKIP() << "python3 not available";
  // 16 runs over 4 methods: coverage and the factor-2 rate must reach 75% (the full validation,
  // 216 runs, is in docs/numerics.md); a broken statistic falls far below.
  const int rc = test::run_command(std::string("python3 ") + NUMATTN_SOURCE_DIR +
                                       "/scripts/validate_estimate.py --quick --min-coverage 0.75 "
                                       "--min-close 0.75 --numattn " + cli() + " 2>&1",
                                   &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("coverage"), std::string::npos) << out;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
