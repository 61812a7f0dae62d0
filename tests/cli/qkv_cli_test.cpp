// `run/bench --qkv DIR --layer L` (a capture directory as the problem), `bench --sweep` and the
// `speedup_vs_exact` column, end to end. The capture directories here are written by the test
// (random arrays plus a manifest as `numattn capture` writes it), so that every inconsistency
// can be crafted; tests/model/capture_test.cpp covers real captures.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "numattn/core/npy.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using Result = test::CliResult;
using test::cli;
using test::expect_cli_error;

using nlohmann::json;

json cli_json(const std::string& args) {
  std::string out;
  const int rc = test::run_command(std::string(NUMATTN_CLI_PATH) + " " + args + " 2>/dev/null", &out);
  EXPECT_EQ(rc, 0) << args << "\n" << out;
  return rc == 0 ? json::parse(out) : json();
}

std::vector<float> random(std::size_t n, std::uint64_t stream) {
  std::vector<float> v(n);
  fill_normal(v, test::base_seed(), stream);
  return v;
}

// A capture directory: layers `layers`, q [H,N,D], k/v [Hkv,N,D]; `manifest` edits applied.
std::string write_capture(const test::ScratchDir& dir, const std::string& name, std::int64_t H,
                          std::int64_t Hkv, std::int64_t N, std::int64_t D,
                          const std::vector<int>& layers, const json& edits = json::object()) {
  const std::string d = dir.file(name);
  std::filesystem::create_directories(d);
  json m{{"format", "numattn-qkv-capture"}, {"version", 1}, {"tokens", N}, {"heads", H},
         {"kv_heads", Hkv}, {"head_dim", D}, {"layers", layers}, {"rope", "post"}};
  for (int l : layers) {
    const std::string p = "layer" + std::to_string(l) + "_";
    npy::write(d + "/" + p + "q.npy", {H, N, D}, random(static_cast<std::size_t>(H * N * D), 10 * l + 1).data());
    npy::write(d + "/" + p + "k.npy", {Hkv, N, D}, random(static_cast<std::size_t>(Hkv * N * D), 10 * l + 2).data());
    npy::write(d + "/" + p + "v.npy", {Hkv, N, D}, random(static_cast<std::size_t>(Hkv * N * D), 10 * l + 3).data());
    m["files"][std::to_string(l)] = {{"q", p + "q.npy"}, {"k", p + "k.npy"}, {"v", p + "v.npy"}};
  }
  m.merge_patch(edits);
  std::ofstream(d + "/manifest.json") << m.dump(2);
  return d;
}

std::vector<float> read_f32(const std::string& path) { return npy::read(path).as_f32(); }

TEST(QkvCli, RunOnACaptureEqualsRunOnItsFiles) {
  test::ScratchDir dir;
  const std::string cap = write_capture(dir, "cap", 6, 2, 40, 16, {0, 3});
  const std::string common = " --method exact.naive --causal bottom-right --format json --threads 2";
  const json a = cli_json("run --qkv " + cap + " --layer 3 --out " + dir.file("a.npy") + common);
  const json b = cli_json("run --q " + cap + "/layer3_q.npy --k " + cap + "/layer3_k.npy --v " + cap +
                          "/layer3_v.npy --out " + dir.file("b.npy") + common);
  ASSERT_TRUE(a.is_object() && b.is_object());
  EXPECT_EQ(a["source"], "capture " + cap + " layer 3");
  EXPECT_EQ(b["source"].get<std::string>().rfind("files ", 0), 0u);
  EXPECT_TRUE(a["seed"].is_null());
  for (const char* k : {"heads", "kv_heads", "n", "n_kv", "d", "dv", "causal"}) EXPECT_EQ(a[k], b[k]) << k;
  EXPECT_EQ(a["heads"], 6);
  EXPECT_EQ(a["kv_heads"], 2);
  EXPECT_EQ(read_f32(dir.file("a.npy")), read_f32(dir.file("b.npy")));
  EXPECT_LT(a["rel_fro_error"].get<double>(), 1e-5);
  // --logit-scale multiplies q, with files as with random inputs.
  auto q = read_f32(cap + "/layer3_q.npy");
  for (float& x : q) x *= 3.f;
  npy::write(dir.file("q3.npy"), {6, 40, 16}, q.data());
  cli_json("run --qkv " + cap + " --layer 3 --logit-scale 3 --out " + dir.file("c.npy") + common);
  cli_json("run --q " + dir.file("q3.npy") + " --k " + cap + "/layer3_k.npy --v " + cap +
           "/layer3_v.npy --out " + dir.file("d.npy") + common);
  EXPECT_EQ(read_f32(dir.file("c.npy")), read_f32(dir.file("d.npy")));
  // The random source is named too.
  const json r = cli_json("run --n 8 --d 4 --dist spiky --format json");
  EXPECT_EQ(r["source"], "random spiky");
}

TEST(QkvCli, ConflictingFlagsAreRefusedByName) {
  test::ScratchDir dir;
  const std::string cap = write_capture(dir, "cap", 4, 2, 8, 4, {0});
  const std::string run = "run --qkv " + cap + " --layer 0";
  expect_cli_error(run + " --n 16", {"error: --n: ", "cannot be combined with --qkv"});
  expect_cli_error(run + " --heads 4", {"error: --heads: ", "--qkv"});
  expect_cli_error(run + " --seed 3", {"error: --seed: ", "--qkv"});
  expect_cli_error(run + " --dist spiky", {"error: --dist: ", "--qkv"});
  expect_cli_error(run + " --layout bnhd", {"error: --layout: ", "--qkv"});
  expect_cli_error(run + " --q " + cap + "/layer0_q.npy", {"error: --q: ", "--qkv"});
  expect_cli_error("run --qkv " + cap, {"error: --qkv: ", "--layer"});
  expect_cli_error("run --layer 0", {"error: --layer: ", "--qkv"});
  expect_cli_error("run --q " + cap + "/layer0_q.npy --k " + cap + "/layer0_k.npy --v " + cap +
                   "/layer0_v.npy --d 4",
               {"error: --d: ", "--q/--k/--v"});
  expect_cli_error(run + " --out " + cap + "/layer0_k.npy", {"--out", "layer0_k.npy"});
  expect_cli_error("bench --qkv " + cap + " --layer 0 --n 8", {"error: --n: ", "--qkv"});
  expect_cli_error("bench --qkv " + cap, {"error: --qkv: ", "--layer"});
  expect_cli_error("bench --qkv " + cap + " --layer 0,x", {"error: --layer: ", "'x'"});
}

TEST(QkvCli, TheManifestIsCheckedAgainstTheFiles) {
  test::ScratchDir dir;
  const std::string good = write_capture(dir, "good", 4, 2, 8, 4, {0, 5});
  expect_cli_error("run --qkv " + good + " --layer 2", {"error: --layer: ", "layer 2", "layers 0, 5"});
  // A file whose shape is not the manifest's.
  const std::string shape = write_capture(dir, "shape", 4, 2, 8, 4, {0}, {{"tokens", 9}});
  expect_cli_error("run --qkv " + shape + " --layer 0", {"layer0_q.npy", "[4, 9, 4]", "does not match"});
  const std::string kvh = write_capture(dir, "kvh", 4, 2, 8, 4, {0}, {{"kv_heads", 3}});
  expect_cli_error("run --qkv " + kvh + " --layer 0", {"manifest.json", "kv_heads (3)", "GQA"});
  const std::string esc = write_capture(dir, "esc", 4, 2, 8, 4, {0},
                                        {{"files", {{"0", {{"q", "../good/layer0_q.npy"}}}}}});
  expect_cli_error("run --qkv " + esc + " --layer 0", {"files.0.q", "inside the directory"});
  const std::string fmt = write_capture(dir, "fmt", 4, 2, 8, 4, {0}, {{"format", "other"}});
  expect_cli_error("run --qkv " + fmt + " --layer 0", {"manifest.json", "numattn-qkv-capture"});
  const std::string ver = write_capture(dir, "ver", 4, 2, 8, 4, {0}, {{"version", 2}});
  expect_cli_error("run --qkv " + ver + " --layer 0", {"manifest.json", "version 2 is not one this numattn reads"});
  std::filesystem::create_directories(dir.file("empty"));
  expect_cli_error("run --qkv " + dir.file("empty") + " --layer 0", {"manifest.json"});
  expect_cli_error("run --qkv " + good + "/manifest.json --layer 0", {"error: --qkv: ", "not a directory"});
}

TEST(QkvCli, BenchRowsOnCapturesCarrySourceAndSpeedup) {
  test::ScratchDir dir;
  const std::string cap = write_capture(dir, "cap", 4, 2, 64, 16, {0, 1});
  const json rows = cli_json("bench --qkv " + cap + " --layer 0,1 --causal none,bottom-right "
                             "--method exact.flash --method exact.naive --reps 1 --format json "
                             "--gemm-size 64 --threads 2");
  ASSERT_TRUE(rows.is_array());
  ASSERT_EQ(rows.size(), 1u + 2 * 2 * 2);
  EXPECT_EQ(rows[0]["method"], "blas.sgemm");
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const json& r = rows[i];
    EXPECT_EQ(r["status"], "ok") << r.dump();
    EXPECT_EQ(r["source"], "capture " + cap + " layer " + std::to_string((i - 1) / 4)) << r.dump();
    EXPECT_EQ(r["n"], 64);
    EXPECT_TRUE(r["seed"].is_null());
    ASSERT_TRUE(r["speedup_vs_exact"].is_number()) << r.dump();
    EXPECT_TRUE(r["efficiency"].is_number());
    // exact.flash at its defaults is the baseline itself.
    if (r["method"].get<std::string>().rfind("exact.flash", 0) == 0) EXPECT_EQ(r["speedup_vs_exact"], 1.0);
    else EXPECT_GT(r["speedup_vs_exact"].get<double>(), 0.0);
  }
  // Without exact.flash in the list the baseline is timed on its own.
  const json naive = cli_json("bench --n 64 --d 8 --method exact.naive --reps 1 --format json --gemm-size 64");
  ASSERT_EQ(naive.size(), 2u);
  EXPECT_GT(naive[1]["speedup_vs_exact"].get<double>(), 0.0);
  EXPECT_EQ(naive[1]["source"], "random gaussian");
}

TEST(QkvCli, SweepGivesOneRowPerValue) {
  test::ScratchDir dir;
  const std::string cap = write_capture(dir, "cap", 4, 2, 48, 8, {2});
  for (const std::string input : {std::string("--n 48 --d 8"), "--qkv " + cap + " --layer 2"}) {
    const json rows = cli_json("bench " + input + " --method 'exact.flash(block_k=32)' --sweep "
                               "block_q=8,16,32 --reps 1 --format json --gemm-size 64");
    ASSERT_EQ(rows.size(), 4u) << input;
    const char* expect[] = {"exact.flash(block_q=8,block_k=32,split_kv=0,key_lanes=-1)",
                            "exact.flash(block_q=16,block_k=32,split_kv=0,key_lanes=-1)",
                            "exact.flash(block_q=32,block_k=32,split_kv=0,key_lanes=-1)"};
    for (int i = 0; i < 3; ++i) {
      const json& r = rows[static_cast<std::size_t>(i) + 1];
      EXPECT_EQ(r["method"], expect[i]);
      EXPECT_EQ(r["sweep_param"], "block_q");
      EXPECT_EQ(r["sweep_value"], std::to_string(8 << i));
      EXPECT_EQ(r["status"], "ok");
      EXPECT_TRUE(r["speedup_vs_exact"].is_number());
      EXPECT_LT(r["rel_fro_error"].get<double>(), 1e-5);
    }
  }
  expect_cli_error("bench --method exact.flash --sweep tile=1,2", {"error: --sweep: ", "'tile'", "block_q, block_k, split_kv"});
  expect_cli_error("bench --method exact.flash --method exact.naive --sweep block_q=8", {"error: --sweep: ", "one --method"});
  expect_cli_error("bench --sweep block_q=8", {"error: --sweep: ", "one --method"});
  expect_cli_error("bench --method exact.flash --sweep block_q=0", {"error: --sweep: ", "block_q"});
  expect_cli_error("bench --method exact.flash --sweep block_q", {"error: --sweep: ", "PARAM=v1,v2"});
  expect_cli_error("bench --method exact.flash --sweep block_q=", {"error: --sweep: ", "has no values"});
  expect_cli_error("bench --method exact.flash --sweep block_q=8,,16", {"error: --sweep: ", "empty item"});
}

// A swept value may be a spec with its own commas: the values split only outside parentheses.
TEST(QkvCli, SweepValuesMayBeNestedSpecs) {
  const json rows = cli_json("bench --n 40 --d 8 --causal top-left --method auto.causal --sweep "
                             "'inner=lowrank.nystrom(landmarks=8,iters=2), exact.naive' --reps 1 "
                             "--format json --gemm-size 64");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1]["sweep_value"], "lowrank.nystrom(landmarks=8,iters=2)");
  EXPECT_EQ(rows[2]["sweep_value"], "exact.naive");
  for (int i = 1; i <= 2; ++i) {
    EXPECT_EQ(rows[static_cast<std::size_t>(i)]["sweep_param"], "inner");
    EXPECT_EQ(rows[static_cast<std::size_t>(i)]["status"], "ok");
  }
  expect_cli_error("bench --method auto.causal --sweep 'inner=lowrank.nystrom(landmarks=8,exact.naive'",
                   {"error: --sweep: ", "never closed"});
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
