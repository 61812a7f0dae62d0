// The CLI at the edges of problem.h: overflow and non-finite inputs end in `error: ...` and a
// non-zero exit (naming the file and the element for .npy inputs), and no report ever holds a
// non-number where a number belongs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "numattn/core/npy.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

std::string cli() { return NUMATTN_CLI_PATH; }

/// Runs the CLI; stderr is folded into the returned text unless `stdout_only`.
std::string run(const std::string& args, int* rc, bool stdout_only = false) {
  std::string out;
  *rc = test::run_command(cli() + " " + args + (stdout_only ? " 2>/dev/null" : " 2>&1"), &out);
  return test::strip_notes(out);
}

TEST(CliEdges, AHugeArgumentIsQuotedByItsEndsInTheError) {
  // Errors quote what they refuse; a 100k-character argument must not come back whole.
  const std::string huge(100000, 'x');
  for (const std::string& args : {"run --n 8 --d 8 --heads 1 --method " + huge,
                                  "run --n 8 --d 8 --heads 1 --causal " + huge,
                                  "bench --n 8 --d 8 --heads 1 --methods exact.flash," + huge}) {
    const test::CliResult r = test::cli(args);
    EXPECT_EQ(r.rc == 0, false) << r.out.substr(0, 300);
    EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << r.out.substr(0, 300);
    EXPECT_LT(r.out.size(), 2000u) << r.out.substr(0, 300);
    EXPECT_NE(r.out.find("characters]"), std::string::npos) << r.out.substr(0, 300);
  }
}

TEST(CliEdges, LogitsBeyondFloat32EndInAnErrorNamingTheLse) {
  for (const char* m : {"exact.naive", "exact.flash", "exact.reference"}) {
    int rc = 0;
    const std::string out = run(std::string("run --method ") + m + " --scale 1e38 --n 64 --heads 2 --d 16", &rc);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << out;
    EXPECT_NE(out.find("log-sum-exp of query row [b,h,i] = [0,0,0]"), std::string::npos) << out;
  }
}

TEST(CliEdges, LogitsBeyondFloat32WithoutTheLseGiveTheOutput) {
  for (const char* m : {"exact.naive", "exact.flash", "exact.reference"}) {
    int rc = 0;
    const std::string out = run(std::string("run --method ") + m +
                                    " --scale 1e38 --n 64 --heads 2 --d 16 --no-lse --format json",
                                &rc, true);
    ASSERT_EQ(rc, 0) << m << "\n" << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["status"], "ok") << j.dump();
    EXPECT_EQ(j["max_abs_error"].get<double>(), 0.0) << j.dump();  // one-hot rows, recomputed
    EXPECT_TRUE(j["lse_max_abs_error"].is_null()) << j.dump();
  }
  int rc = 0;
  const std::string out = run("run --no-lse --lse-out x.npy", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("error: --lse-out needs the LSE"), std::string::npos) << out;
}

TEST(CliEdges, HugeFiniteLogitsStillWorkAndReportNumbers) {
  for (const char* m : {"exact.naive", "exact.flash"}) {
    int rc = 0;
    const std::string out =
        run(std::string("run --method ") + m + " --scale 1e36 --n 64 --heads 2 --d 16 --format json", &rc);
    ASSERT_EQ(rc, 0) << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["status"], "ok");
    for (const char* k : {"rel_fro_error", "max_abs_error", "lse_max_abs_error", "nmse"})
      EXPECT_TRUE(j[k].is_number()) << k << " " << j.dump();
    EXPECT_EQ(j["max_abs_error"].get<double>(), 0.0) << j.dump();  // one-hot rows
  }
}

TEST(CliEdges, NonFiniteNpyInputsNameTheFileAndTheElement) {
  const test::ScratchDir scratch;
  const int H = 2, N = 5, NK = 7, D = 3;
  std::vector<float> q(H * N * D), k(H * NK * D), v(H * NK * D);
  fill_normal(q, 3, 0);
  fill_normal(k, 3, 1);
  fill_normal(v, 3, 2);
  const std::string qf = scratch.file("q.npy"), kf = scratch.file("k.npy"), vf = scratch.file("v.npy");
  npy::write(qf, {H, N, D}, q.data());
  npy::write(vf, {H, NK, D}, v.data());
  k[(1 * NK + 4) * D + 2] = std::numeric_limits<float>::infinity();
  npy::write(kf, {H, NK, D}, k.data());
  int rc = 0;
  std::string out = run("run --method exact.flash --q " + qf + " --k " + kf + " --v " + vf, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("error: attention: k[0,1,4,2] is inf"), std::string::npos) << out;
  EXPECT_NE(out.find("(element [1,4,2] of " + kf + ")"), std::string::npos) << out;

  // [B, N, H, D] files: the element is named in the file's own order.
  std::vector<float> k4(static_cast<std::size_t>(NK * H * D)), q4(static_cast<std::size_t>(N * H * D)),
      v4(static_cast<std::size_t>(NK * H * D));
  fill_normal(q4, 4, 0);
  fill_normal(k4, 4, 1);
  fill_normal(v4, 4, 2);
  q4[(3 * H + 1) * D + 0] = std::numeric_limits<float>::quiet_NaN();  // file [0, 3, 1, 0] = q[0,1,3,0]
  npy::write(qf, {1, N, H, D}, q4.data());
  npy::write(kf, {1, NK, H, D}, k4.data());
  npy::write(vf, {1, NK, H, D}, v4.data());
  out = run("run --method exact.naive --layout bnhd --q " + qf + " --k " + kf + " --v " + vf, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("q[0,1,3,0] is nan"), std::string::npos) << out;
  EXPECT_NE(out.find("(element [0,3,1,0] of " + qf + ")"), std::string::npos) << out;

  std::vector<float> mask(N * NK, 0.f);
  mask[2 * NK + 6] = std::numeric_limits<float>::infinity();
  const std::string mf = scratch.file("m.npy");
  npy::write(mf, {N, NK}, mask.data());
  npy::write(qf, {H, N, D}, q.data());
  k[(1 * NK + 4) * D + 2] = 0.5f;
  npy::write(kf, {H, NK, D}, k.data());
  npy::write(vf, {H, NK, D}, v.data());
  out = run("run --method exact.reference --q " + qf + " --k " + kf + " --v " + vf + " --mask " + mf, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("additive mask[2,6] is inf: +inf is refused"), std::string::npos) << out;
  EXPECT_NE(out.find("(element [2,6] of " + mf + ")"), std::string::npos) << out;
}

TEST(CliEdges, ABenchRowThatFailsKeepsTheSweepAndHoldsNullNotStrings) {
  int rc = 0;
  const std::string out = run(
      "bench --method exact.flash --method exact.naive --n 33 --d 8 --heads 2 --scale 1e36,1e38 --reps 1 "
      "--gemm-size 64 --format json --threads 1", &rc, true);
  ASSERT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 5u);
  for (std::size_t r = 1; r < j.size(); ++r) {
    const auto& row = j[r];
    const bool overflow = r >= 3;  // scale 1e38: the LSE cannot be stored
    EXPECT_EQ(row["status"].get<std::string>().rfind(overflow ? "failed: " : "ok", 0), 0u) << row.dump();
    if (overflow) EXPECT_NE(row["status"].get<std::string>().find("log-sum-exp"), std::string::npos);
    for (const char* k : {"rel_fro_error", "max_abs_error", "lse_max_abs_error", "nmse", "gflops", "time_ms"}) {
      if (!overflow) EXPECT_TRUE(row[k].is_number()) << k << " " << row.dump();
      else EXPECT_FALSE(row.contains(k) && !row[k].is_null()) << k << " " << row.dump();
    }
  }
}

// A flag out of its domain is refused by name, before any work: NaN must not pass for "not
// given" (--scale, --tol had NaN or -1 as that sentinel), nor a negative window other than -1
// for "unbounded", nor a NaN κ threshold for "every head dense", nor --reps 0 for one
// repetition or a report's --reps/--chunks 0 or below for the preset.
TEST(CliEdges, OutOfDomainRealsAndWindowsAreRefusedByName) {
  const std::string npy = test::temp_path("bd_w.npy");
  {
    std::vector<double> w(6 * 4);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::sin(1.0 + static_cast<double>(i));
    npy::write(npy, {6, 4}, w.data());
  }
  const std::pair<std::string, std::string> cases[] = {
      {"run --n 8 --d 8 --heads 1 --scale nan", "--scale: nan is not a finite number"},
      {"run --n 8 --d 8 --heads 1 --scale 1,inf", "--scale: inf is not a finite number"},
      {"run --n 8 --d 8 --heads 1 --logit-scale -inf", "--logit-scale: -inf is not a finite number"},
      {"bench --n 8 --d 8 --heads 1 --logit-scale nan", "--logit-scale: nan is not a finite number"},
      {"run --n 8 --d 8 --heads 1 --window-left -5", "window_left = -5 and window_right = -1: each must be >= 0"},
      {"run --n 8 --d 8 --heads 1 --method exact.naive --window-right -2", "window_right = -2"},
      {"bd --in " + npy + " --tol nan", "--tol: must be a finite number >= 0, got nan"},
      {"bd --in " + npy + " --tol -1", "--tol: must be a finite number >= 0, got -1"},
      {"bd --in " + npy + " --rank -2", "--rank: must be >= 0"},
      {"run --n 8 --d 8 --heads 1 --reps 0", "--reps: Value 0 not in range 1"},
      {"bench --n 8 --d 8 --heads 1 --reps -3", "--reps: Value -3 not in range 1"},
      {"bench --n 8 --d 8 --heads 1 --gemm-size 0", "--gemm-size: Value 0 not in range 1"},
      {"run --n 8 --d 8 --heads 1 --check-rows -2", "--check-rows: Value -2 not in range -1"},
      {"bench-bd --reps 0", "--reps: Value 0 not in range 1"},
      {"report --out " + test::temp_path("rep") + " --chunks -1", "--chunks: Value -1 not in range 1"},
      {"report --out " + test::temp_path("rep") + " --reps 0", "--reps: Value 0 not in range 1"},
      {"convert --out " + test::temp_path("k.gguf") + " --kappa-threshold nan", "--kappa-threshold: must be >= 0"},
      {"convert --out " + test::temp_path("k.gguf") + " --kappa-threshold -1", "--kappa-threshold: must be >= 0"},
  };
  for (const auto& [args, want] : cases) {
    int rc = 0;
    const std::string out = run(args, &rc);
    EXPECT_NE(rc, 0) << args << "\n" << out;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << args << "\n" << out;
    EXPECT_NE(out.find(want), std::string::npos) << args << "\n" << out;
  }
  // The sentinels themselves still mean what they say.
  int rc = 0;
  const std::string ok = run("run --n 8 --d 8 --heads 1 --window-left -1 --window-right 2 --format json", &rc, true);
  EXPECT_EQ(rc, 0) << ok;
  EXPECT_EQ(nlohmann::json::parse(ok)["status"], "ok") << ok;
  EXPECT_EQ(run("bd --in " + npy + " --tol 0", &rc, true).find("error"), std::string::npos);
  EXPECT_EQ(rc, 0);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
