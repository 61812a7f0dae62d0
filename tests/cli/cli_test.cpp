// The numattn CLI end to end: exit codes, JSON schema of run/bench/methods, errors, and the
// .npy interface checked against an independent float64 computation in the test.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

#include "numattn/core/npy.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using nlohmann::json;

std::string cli() { return NUMATTN_CLI_PATH; }

json run_json(const std::string& args, int expect_rc = 0) {
  std::string out;
  int rc = test::run_command(cli() + " " + args + " 2>/dev/null", &out);
  EXPECT_EQ(rc, expect_rc) << args << "\n" << out;
  if (rc != 0) return json();
  return json::parse(out);
}

void expect_run_schema(const json& j) {
  for (const char* k : {"method", "batch", "heads", "kv_heads", "n", "n_kv", "d", "dv", "causal",
                        "seed", "time_ms", "gflops", "target", "target_rel_fro_error", "rel_fro_error", "max_abs_error",
                        "lse_max_abs_error", "workspace_bytes"})
    EXPECT_TRUE(j.contains(k)) << "missing field " << k << " in " << j.dump();
  EXPECT_TRUE(j["time_ms"].is_number());
  EXPECT_TRUE(j["gflops"].is_number());
  EXPECT_TRUE(j["workspace_bytes"].is_number_integer());
  EXPECT_TRUE(j["method"].is_string());
  EXPECT_TRUE(j["target"].is_string());
  // Softmax methods: the target error is the softmax error.
  if (j["target"] == "softmax") EXPECT_EQ(j["target_rel_fro_error"], j["rel_fro_error"]);
}

TEST(Cli, RunPrintsOneJsonObject) {
  json j = run_json("run --method exact.flash --n 100 --n-kv 130 --heads 4 --kv-heads 2 --d 33 "
                    "--causal bottom-right --format json --threads 2");
  ASSERT_TRUE(j.is_object());
  expect_run_schema(j);
  EXPECT_EQ(j["method"], "exact.flash(block_q=64,block_k=256,split_kv=0,key_lanes=-1)");
  EXPECT_EQ(j["n_kv"], 130);
  EXPECT_EQ(j["causal"], "bottom-right");
  EXPECT_LT(j["rel_fro_error"].get<double>(), 1e-5);
  EXPECT_EQ(j["rows_checked"], 400);
}

TEST(Cli, CheckRowsZeroSkipsTheReference) {
  json j = run_json("run --method exact.naive --n 64 --d 8 --check-rows 0 --format json");
  expect_run_schema(j);
  EXPECT_TRUE(j["rel_fro_error"].is_null());
  EXPECT_EQ(j["rows_checked"], 0);
}

TEST(Cli, BenchHasSgemmRowAndEfficiency) {
  json j = run_json("bench --method exact.flash --method exact.naive --n 128,256 --d 32 --heads 2 "
                    "--reps 2 --gemm-size 256 --format json --threads 1");
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 5u);
  EXPECT_EQ(j[0]["method"], "blas.sgemm");
  EXPECT_GT(j[0]["gflops"].get<double>(), 0);
  EXPECT_GT(j[0]["read_gbytes_per_s"].get<double>(), 0);
  for (std::size_t i = 1; i < j.size(); ++i) {
    expect_run_schema(j[i]);
    EXPECT_GT(j[i]["efficiency"].get<double>(), 0);
    EXPECT_EQ(j[i]["status"], "ok");
    // The method's own cost model: predicted time and the measured time over it.
    const double model = j[i]["model_ms"].get<double>();
    EXPECT_GT(model, 0);
    EXPECT_GT(j[i]["model_flops"].get<double>(), 0);
    EXPECT_GT(j[i]["model_bytes"].get<double>(), 0);
    EXPECT_NEAR(j[i]["model_ratio"].get<double>(), j[i]["time_ms"].get<double>() / model, 1e-9 * j[i]["model_ratio"].get<double>());
  }
}

TEST(Cli, MethodsListsTheRegistry) {
  json j = run_json("methods --format json");
  ASSERT_TRUE(j.is_array());
  bool flash = false;
  for (auto& r : j) {
    EXPECT_TRUE(r.contains("name") && r.contains("spec") && r.contains("family") && r.contains("capabilities") &&
                r.contains("target"));
    flash |= r["spec"].get<std::string>().rfind("exact.flash", 0) == 0;
  }
  EXPECT_TRUE(flash);
}

TEST(Cli, ErrorsExitNonZeroWithAMessage) {
  std::string out;
  EXPECT_NE(test::run_command(cli() + " run --method 'exact.flash(bq=1)' 2>&1", &out), 0);
  EXPECT_NE(out.find("error: "), std::string::npos);
  EXPECT_NE(out.find("valid keys"), std::string::npos);
  EXPECT_NE(test::run_command(cli() + " run --heads 3 --kv-heads 2 2>&1", &out), 0);
  EXPECT_NE(out.find("multiple"), std::string::npos);
  EXPECT_NE(test::run_command(cli() + " run --causal sideways 2>&1", &out), 0);
  EXPECT_NE(out.find("top-left"), std::string::npos);
  EXPECT_NE(test::run_command(cli() + " nosuchcommand 2>&1", &out), 0);
  // --lse-out with a method that gives no LSE: refused by name, not a crash.
  EXPECT_EQ(test::run_command(cli() + " run --method lowrank.nystrom --n 64 --d 8 --lse-out " +
                                  test::temp_path("l.npy") + " 2>&1",
                              &out),
            1)
      << out;
  EXPECT_NE(out.find("lse-out"), std::string::npos) << out;
  EXPECT_NE(out.find("gives no LSE"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(cli() + " run --help 2>&1", &out), 0);
  EXPECT_NE(out.find("--check-rows"), std::string::npos);
}

// The environment variables of the quantized products are checked before a command runs: a bad
// value is the first and only thing printed, naming the variable.
TEST(Cli, BadQuantEnvironmentFailsBeforeAnyOutput) {
  std::string out;
  for (const char* bad : {"NUMATTN_GEMV_SPLIT=abc", "NUMATTN_GEMV_SPLIT=-5", "NUMATTN_GEMV_SPLIT=0",
                          "NUMATTN_GEMV_SPLIT=12abc", "NUMATTN_CPU_PATH=bogus"}) {
    const std::string var = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_EQ(test::run_command(std::string(bad) + " " + cli() + " methods 2>&1", &out), 1) << bad << ": " << out;
    EXPECT_EQ(out.rfind("error: " + var, 0), 0u) << bad << ": " << out;
  }
  for (const char* good : {"NUMATTN_GEMV_SPLIT=auto", "NUMATTN_GEMV_SPLIT=32768", "NUMATTN_CPU_PATH=portable"}) {
    EXPECT_EQ(test::run_command(std::string(good) + " " + cli() + " methods 2>&1", &out), 0) << good << ": " << out;
  }
}

TEST(Cli, NpyInterfaceMatchesAnIndependentComputation) {
  namespace fs = std::filesystem;
  const test::ScratchDir scratch;
  const fs::path& dir = scratch.path();
  const int H = 2, N = 5, NK = 7, D = 3;
  std::vector<float> q(H * N * D), k(H * NK * D), v(H * NK * D), mask(N * NK);
  fill_normal(q, 1, 0);
  fill_normal(k, 1, 1);
  fill_normal(v, 1, 2);
  for (int i = 0; i < N * NK; ++i) mask[i] = (i % 4 == 0) ? -INFINITY : 0.1f * (i % 3);
  npy::write((dir / "q.npy").string(), {H, N, D}, q.data());
  npy::write((dir / "k.npy").string(), {H, NK, D}, k.data());
  npy::write((dir / "v.npy").string(), {H, NK, D}, v.data());
  npy::write((dir / "m.npy").string(), {N, NK}, mask.data());
  json j = run_json("run --method exact.flash --q " + (dir / "q.npy").string() + " --k " +
                    (dir / "k.npy").string() + " --v " + (dir / "v.npy").string() + " --mask " +
                    (dir / "m.npy").string() + " --out " + (dir / "o.npy").string() +
                    " --lse-out " + (dir / "l.npy").string() + " --format json");
  expect_run_schema(j);
  auto o = npy::read((dir / "o.npy").string());
  auto l = npy::read((dir / "l.npy").string());
  ASSERT_EQ(o.shape, (std::vector<std::int64_t>{1, H, N, D}));
  ASSERT_EQ(l.shape, (std::vector<std::int64_t>{1, H, N}));
  const double scale = 1.0 / std::sqrt(3.0);
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < N; ++i) {
      std::vector<double> s(NK);
      double m = -INFINITY;
      for (int j2 = 0; j2 < NK; ++j2) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(q[(h * N + i) * D + d]) * k[(h * NK + j2) * D + d];
        s[j2] = scale * dot + mask[i * NK + j2];
        m = std::max(m, s[j2]);
      }
      double z = 0;
      for (int j2 = 0; j2 < NK; ++j2) z += std::exp(s[j2] - m);
      EXPECT_NEAR(l.f32[h * N + i], m + std::log(z), 1e-5);
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int j2 = 0; j2 < NK; ++j2) acc += std::exp(s[j2] - m) / z * v[(h * NK + j2) * D + d];
        EXPECT_NEAR(o.f32[(h * N + i) * D + d], acc, 1e-5);
      }
    }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
