// The bd, bench-bd and bd-study subcommands: output files, fields and numbers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "numattn/core/npy.h"
#include "numattn/core/rng.h"
#include "numattn/decomp/basis_decomposition.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

std::string cli() { return std::string(NUMATTN_CLI_PATH); }

TEST(BdCli, WritesBasisBAndCAndPrintsAccounting) {
  const test::ScratchDir scratch;
  const auto& dir = scratch.path();
  const index_t m = 30, n = 20, r = 4;
  std::vector<double> u(static_cast<std::size_t>(m * r)), v(static_cast<std::size_t>(r * n));
  fill_normal(u, 3, 1);
  fill_normal(v, 3, 2);
  const decomp::MatrixXd w = Eigen::Map<decomp::MatrixXd>(u.data(), m, r) *
                             Eigen::Map<decomp::MatrixXd>(v.data(), r, n);
  const std::string in = (dir / "W.npy").string(), prefix = (dir / "P").string();
  npy::write(in, {m, n}, w.data());
  for (const char* axis : {"rows", "cols"}) {
    std::string out;
    const int rc = test::run_command(cli() + " bd --in " + in + " --rank 4 --axis " + axis +
                                         " --strategy maxmin --out-prefix " + prefix +
                                         " --format json",
                                     &out);
    ASSERT_EQ(rc, 0) << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["m"], m);
    EXPECT_EQ(j["n"], n);
    EXPECT_EQ(j["rank"], r);
    EXPECT_EQ(j["strategy"], "maxmin");
    EXPECT_LT(j["residual_rel"].get<double>(), 1e-12);
    EXPECT_GE(j["cond_basis"].get<double>(), 1.0);
    EXPECT_EQ(j["params_dense"], m * n);
    EXPECT_EQ(j["params_lowrank"], r * (m + n));
    EXPECT_EQ(j["params_bd"], r * (m + n - r));
    EXPECT_EQ(j["macs_dense"], m * n);
    EXPECT_EQ(j["macs_bd"], r * (m + n - r));
    const npy::Array s = npy::read(prefix + ".basis.npy");
    const npy::Array b = npy::read(prefix + ".B.npy");
    const npy::Array c = npy::read(prefix + ".C.npy");
    ASSERT_EQ(s.dtype, npy::DType::kInt64);
    ASSERT_EQ(s.numel(), r);
    const bool rows = std::string(axis) == "rows";
    const decomp::MatrixXd bm = Eigen::Map<const decomp::MatrixXd>(b.f64.data(), b.shape[0], b.shape[1]);
    const decomp::MatrixXd cm = Eigen::Map<const decomp::MatrixXd>(c.f64.data(), c.shape[0], c.shape[1]);
    // W[S^c] = C·B (rows) or W[:,S^c] = B·C (cols).
    std::vector<char> in_s(static_cast<std::size_t>(rows ? m : n), 0);
    for (auto i : s.i64) in_s[static_cast<std::size_t>(i)] = 1;
    const decomp::MatrixXd rest = rows ? decomp::MatrixXd(cm * bm) : decomp::MatrixXd(bm * cm);
    index_t k = 0;
    for (index_t i = 0; i < (rows ? m : n); ++i) {
      if (in_s[static_cast<std::size_t>(i)]) continue;
      const double err = rows ? (rest.row(k) - w.row(i)).norm() : (rest.col(k) - w.col(i)).norm();
      EXPECT_LT(err, 1e-10) << axis << " index " << i;
      ++k;
    }
  }
  std::string out;
  EXPECT_NE(test::run_command(cli() + " bd --in " + in + " --rank 99 2>&1", &out), 0);
  EXPECT_NE(out.find("error"), std::string::npos) << out;
}

TEST(BdCli, BenchBdPrintsTheoryAndSpeedup) {
  std::string out;
  const int rc = test::run_command(cli() + " bench-bd --d 64 --head-dim 16 --heads 4 --tokens 32,64 "
                                           "--threads 1 --reps 1 --gemm-size 64 --format json 2>/dev/null",
                                   &out);
  ASSERT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 2u);
  for (const auto& row : j) {
    for (const char* f : {"d", "head_dim", "heads", "tokens", "dense_ms", "bd_ms", "speedup", "theory"})
      EXPECT_TRUE(row.contains(f)) << f;
    EXPECT_DOUBLE_EQ(row["theory"].get<double>(), 64.0 / 48.0);
    EXPECT_LT(row["check_rel_err"].get<double>(), 1e-4);
  }
}

TEST(BdCli, StudyRuns) {
  std::string out;
  const int rc = test::run_command(cli() + " bd-study --setups mha768 --strategies residual_min,maxmin "
                                           "--seeds 1 --tokens 16 --threads 1 --format json 2>/dev/null",
                                   &out);
  ASSERT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_LT(j[1]["kappa_qk_max"].get<double>() * 3, j[0]["kappa_qk_max"].get<double>());
  EXPECT_LT(j[1]["out_err_bda"].get<double>(), j[0]["out_err_bda"].get<double>());
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
