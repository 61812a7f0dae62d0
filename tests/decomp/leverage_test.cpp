// Leverage scores (decomp/leverage.h): in [0, 1], summing to rank(K) (full rank and
// rank-deficient), equal to the dense formula diag(K·(KᵀK)⁺·Kᵀ); online
// scores equal their definition and bound the offline ones from above.
#include <gtest/gtest.h>

#include <Eigen/Core>

#include <numeric>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/decomp/dense.h"
#include "numattn/decomp/leverage.h"

namespace numattn::decomp {
namespace {
namespace NUMATTN_UNITY_ID {

Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> random_rows(index_t n, index_t d,
                                                                                   std::uint64_t seed) {
  std::vector<double> x(static_cast<std::size_t>(n * d));
  fill_normal(std::span<double>(x), seed, 0);
  Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> m(n, d);
  std::copy(x.begin(), x.end(), m.data());
  return m;
}

using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

std::vector<double> dense_scores(const RowMat& K) {
  const Eigen::MatrixXd G = K.transpose() * K;
  const Eigen::MatrixXd Gp = dense::pinv(G);
  std::vector<double> s(static_cast<std::size_t>(K.rows()));
  for (index_t j = 0; j < K.rows(); ++j) s[static_cast<std::size_t>(j)] = K.row(j) * Gp * K.row(j).transpose();
  return s;
}

TEST(LeverageScores, FullRankSumToDAndMatchTheDenseFormula) {
  const RowMat K = random_rows(200, 16, 1);
  const LeverageScores l = leverage_scores(K.data(), 200, 16, 16);
  EXPECT_EQ(l.rank, 16);
  const std::vector<double> ref = dense_scores(K);
  double sum = 0;
  for (std::size_t j = 0; j < l.scores.size(); ++j) {
    EXPECT_GE(l.scores[j], 0.0);
    EXPECT_LE(l.scores[j], 1.0);
    EXPECT_NEAR(l.scores[j], ref[j], 1e-10);
    sum += l.scores[j];
  }
  EXPECT_NEAR(sum, 16.0, 1e-10);
}

TEST(LeverageScores, RankDeficientSumToTheRank) {
  // K = A·B with A 120×3, B 3×10: rank 3; plus a duplicated column and a zero row.
  const RowMat A = random_rows(120, 3, 2), B = random_rows(3, 10, 3);
  RowMat K = A * B;
  K.row(5).setZero();
  const LeverageScores l = leverage_scores(K.data(), 120, 10, 10);
  EXPECT_EQ(l.rank, 3);
  EXPECT_NEAR(std::accumulate(l.scores.begin(), l.scores.end(), 0.0), 3.0, 1e-9);
  EXPECT_EQ(l.scores[5], 0.0);
  for (double s : l.scores) {
    EXPECT_GE(s, 0.0);
    EXPECT_LE(s, 1.0);
  }
  // Fewer rows than columns: every row is its own direction.
  const RowMat W = random_rows(4, 9, 4);
  const LeverageScores w = leverage_scores(W.data(), 4, 9, 9);
  EXPECT_EQ(w.rank, 4);
  for (double s : w.scores) EXPECT_NEAR(s, 1.0, 1e-12);
  // Zero matrix: rank 0.
  const RowMat Z = RowMat::Zero(5, 3);
  EXPECT_EQ(leverage_scores(Z.data(), 5, 3, 3).rank, 0);
  // One outlier row carries its own direction: score 1.
  RowMat O = random_rows(100, 4, 5);
  O.col(3).setZero();
  O(17, 3) = 1e-3;
  EXPECT_NEAR(leverage_scores(O.data(), 100, 4, 4).scores[17], 1.0, 1e-9);
}

TEST(LeverageScores, OnlineScoresMatchTheirDefinitionAndBoundTheOfflineOnes) {
  const RowMat K = random_rows(60, 6, 6);
  const double lambda = 1e-3;
  const std::vector<double> on = online_leverage_scores(K.data(), 60, 6, 6, lambda);
  const LeverageScores off = leverage_scores(K.data(), 60, 6, 6);
  double sum = 0;
  for (index_t j = 0; j < 60; ++j) {
    const RowMat P = K.topRows(j + 1);
    const Eigen::MatrixXd M = P.transpose() * P + lambda * Eigen::MatrixXd::Identity(6, 6);
    const double ref = K.row(j).dot(dense::cholesky_solve(M, K.row(j).transpose()).x.col(0));
    EXPECT_NEAR(on[static_cast<std::size_t>(j)], ref, 1e-10) << j;
    EXPECT_GE(on[static_cast<std::size_t>(j)], off.scores[static_cast<std::size_t>(j)] * (1 - 1e-3)) << j;
    sum += on[static_cast<std::size_t>(j)];
  }
  EXPECT_GT(sum, 6.0 - 1e-3);  // the first d rows alone score ≈ 1 each
  EXPECT_THROW(online_leverage_scores(K.data(), 60, 6, 6, 0.0), Error);
  RowMat bad = K;
  bad(3, 2) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(leverage_scores(bad.data(), 60, 6, 6), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::decomp
