// RPCholesky (decomp/rpcholesky.h): full rank reproduces G, early termination on exhausted
// rank, the trace error falls as r grows, the weighted form equals RPCholesky of D·G̃·D,
// determinism per (seed, stream).
#include <gtest/gtest.h>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "numattn/core/rng.h"
#include "numattn/decomp/rpcholesky.h"

namespace numattn::decomp {
namespace {
namespace NUMATTN_UNITY_ID {

Eigen::MatrixXd random_matrix(index_t rows, index_t cols, std::uint64_t seed) {
  std::vector<double> x(static_cast<std::size_t>(rows * cols));
  fill_normal(std::span<double>(x), seed, 0);
  Eigen::MatrixXd m(rows, cols);
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) m(i, j) = x[static_cast<std::size_t>(i * cols + j)];
  return m;
}

/// Gaussian kernel exp(−‖xᵢ − xⱼ‖²/(2h²)) of the rows of X.
Eigen::MatrixXd gaussian_kernel(const Eigen::MatrixXd& X, double h) {
  const index_t n = X.rows();
  Eigen::MatrixXd G(n, n);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j) G(i, j) = std::exp(-(X.row(i) - X.row(j)).squaredNorm() / (2 * h * h));
  return G;
}

RpCholeskyResult factor(const Eigen::MatrixXd& G, index_t r, std::uint64_t seed, std::uint64_t stream = 0,
                        std::span<const double> logw = {}) {
  std::vector<double> diag(static_cast<std::size_t>(G.rows()));
  for (index_t i = 0; i < G.rows(); ++i) diag[static_cast<std::size_t>(i)] = G(i, i);
  RpCholeskyOptions opt;
  opt.rank = r;
  opt.seed = seed;
  opt.stream = stream;
  opt.log_weight = logw;
  return rp_cholesky(G.rows(), diag, [&](index_t j, double* col) {
    for (index_t i = 0; i < G.rows(); ++i) col[i] = G(i, j);
  }, opt);
}

TEST(RpCholesky, FullRankReproducesG) {
  const Eigen::MatrixXd B = random_matrix(30, 30, 1);
  const Eigen::MatrixXd G = B * B.transpose() + Eigen::MatrixXd::Identity(30, 30);
  const RpCholeskyResult f = factor(G, 30, 7);
  ASSERT_EQ(f.pivots.size(), 30u);
  EXPECT_FALSE(f.early_stop);
  EXPECT_LT((f.factor * f.factor.transpose() - G).norm() / G.norm(), 1e-12);
  EXPECT_EQ(std::set<index_t>(f.pivots.begin(), f.pivots.end()).size(), 30u) << "pivots are distinct";
  // F(S, :) is lower triangular in pivot order: each column vanishes at the earlier pivots.
  for (index_t t = 0; t < 30; ++t)
    for (index_t u = t + 1; u < 30; ++u) EXPECT_NEAR(f.factor(f.pivots[static_cast<std::size_t>(t)], u), 0.0, 1e-10);
  EXPECT_LT(f.residual_trace, 1e-10 * f.initial_trace);
}

TEST(RpCholesky, StopsEarlyWhenTheRankIsExhausted) {
  const Eigen::MatrixXd B = random_matrix(40, 5, 2);
  const Eigen::MatrixXd G = B * B.transpose();  // rank 5
  const RpCholeskyResult f = factor(G, 20, 3);
  EXPECT_TRUE(f.early_stop);
  EXPECT_EQ(f.pivots.size(), 5u);
  EXPECT_LT((f.factor * f.factor.transpose() - G).norm() / G.norm(), 1e-10);
  EXPECT_LE(f.residual_trace, 1e-12 * f.initial_trace);
  // Zero matrix: nothing to pivot on.
  const RpCholeskyResult z = factor(Eigen::MatrixXd::Zero(6, 6), 3, 1);
  EXPECT_TRUE(z.pivots.empty());
  EXPECT_TRUE(z.early_stop);
  EXPECT_EQ(z.factor.cols(), 0);
}

TEST(RpCholesky, TraceErrorFallsAsTheRankGrows) {
  const Eigen::MatrixXd X = random_matrix(300, 3, 4);
  const Eigen::MatrixXd G = gaussian_kernel(X, 2.0);
  std::vector<double> med;
  for (index_t r : {4, 8, 16, 32, 64}) {
    std::vector<double> e;
    for (std::uint64_t seed = 1; seed <= 7; ++seed) {
      const RpCholeskyResult f = factor(G, r, seed);
      const double trace_err = (G - f.factor * f.factor.transpose()).trace() / G.trace();
      EXPECT_NEAR(trace_err, f.residual_trace / f.initial_trace, 1e-9);
      e.push_back(trace_err);
    }
    std::sort(e.begin(), e.end());
    med.push_back(e[3]);
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "r step " << i;
  EXPECT_LT(med.back(), 1e-2 * med.front());
}

TEST(RpCholesky, WeightedFormIsRpCholeskyOfDGD) {
  const Eigen::MatrixXd X = random_matrix(60, 4, 5);
  const Eigen::MatrixXd Gt = gaussian_kernel(X, 1.5);
  std::vector<double> w(60);
  for (index_t i = 0; i < 60; ++i) w[static_cast<std::size_t>(i)] = 0.5 * X.row(i).squaredNorm();
  Eigen::VectorXd D(60);
  for (index_t i = 0; i < 60; ++i) D(i) = std::exp(w[static_cast<std::size_t>(i)] / 2);
  const Eigen::MatrixXd G = D.asDiagonal() * Gt * D.asDiagonal();
  const RpCholeskyResult direct = factor(G, 12, 9, 4);
  const RpCholeskyResult weighted = factor(Gt, 12, 9, 4, w);
  ASSERT_EQ(direct.pivots, weighted.pivots);
  EXPECT_LT((direct.factor - D.asDiagonal() * weighted.factor).norm() / direct.factor.norm(), 1e-12);
  // Huge weights, whose D·G̃·D would overflow float64: still a valid factorisation of G̃.
  for (double& x : w) x += 2000;
  const RpCholeskyResult big = factor(Gt, 12, 9, 4, w);
  EXPECT_EQ(big.pivots, weighted.pivots);
}

TEST(RpCholesky, DeterministicPerSeedAndStream) {
  const Eigen::MatrixXd G = gaussian_kernel(random_matrix(80, 2, 6), 0.7);
  EXPECT_EQ(factor(G, 10, 3, 1).pivots, factor(G, 10, 3, 1).pivots);
  EXPECT_NE(factor(G, 10, 3, 1).pivots, factor(G, 10, 3, 2).pivots);
  EXPECT_NE(factor(G, 10, 3, 1).pivots, factor(G, 10, 4, 1).pivots);
}

TEST(RpCholesky, RejectsBadInput) {
  std::vector<double> diag = {1.0, -1.0};
  RpCholeskyOptions opt;
  opt.rank = 1;
  auto col = [](index_t, double* c) { c[0] = c[1] = 0; };
  EXPECT_THROW(rp_cholesky(2, diag, col, opt), Error);
  diag = {1.0};
  EXPECT_THROW(rp_cholesky(2, diag, col, opt), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::decomp
