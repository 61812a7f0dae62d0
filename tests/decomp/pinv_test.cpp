// Newton–Schulz-type pseudo-inverse (as in Nyströmformer, Xiong et al. 2021) and the exact SVD
// pseudo-inverse: convergence to the Moore–Penrose inverse on well-conditioned matrices, reported
// non-convergence on ill-conditioned ones, the row-stochastic initial scaling, the scalar error
// recursion.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "numattn/core/rng.h"
#include "numattn/decomp/dense.h"
#include "numattn/decomp/pinv.h"
#include "support/test_util.h"

namespace numattn::decomp {
namespace {
namespace NUMATTN_UNITY_ID {

using Md = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Mf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Md randn(Eigen::Index rows, Eigen::Index cols, std::uint64_t stream) {
  std::vector<double> v(static_cast<std::size_t>(rows * cols));
  fill_normal(v, test::base_seed(), stream);
  return Eigen::Map<Md>(v.data(), rows, cols);
}

/// A row-stochastic softmax matrix of random logits (Nyströmformer's F2).
Md softmax_matrix(Eigen::Index m, double temperature, std::uint64_t stream) {
  Md s = randn(m, m, stream) * temperature;
  for (Eigen::Index i = 0; i < m; ++i) {
    s.row(i).array() = (s.row(i).array() - s.row(i).maxCoeff()).exp();
    s.row(i) /= s.row(i).sum();
  }
  return s;
}

/// U·diag(σ)·Vᵀ with random orthogonal U, V and the given singular values.
Md with_singular_values(const Eigen::VectorXd& sigma, std::uint64_t stream) {
  const Eigen::Index m = sigma.size();
  const Eigen::MatrixXd u = dense::qr(randn(m, m, stream)).q, v = dense::qr(randn(m, m, stream + 1)).q;
  return Md(u * sigma.asDiagonal() * v.transpose());
}

TEST(NewtonSchulzPinv, ScalarErrorRecursion) {
  // On a 1×1 matrix c, x = c·z obeys 1 − x' = ¼ (1 − x)³ (4 − x).
  Md c(1, 1);
  c(0, 0) = 0.3;
  NewtonSchulzPinv<double> ns(1);
  ns.compute(c);
  const double x0 = 0.3 * 0.3 / (0.3 * 0.3), x1 = 0.3 * ns.pinv()(0, 0);
  EXPECT_NEAR(1 - x1, 0.25 * std::pow(1 - x0, 3) * (4 - x0), 1e-15);
  Md c2(2, 2);
  c2 << 2, 0, 0, 0.5;  // x0 = σ²/(‖C‖₁‖C‖∞) = 1 and 1/16
  NewtonSchulzPinv<double> one(1);
  one.compute(c2);
  const double x = 0.5 * one.pinv()(1, 1), x0b = 0.25 / 4.0;
  EXPECT_NEAR(1 - x, 0.25 * std::pow(1 - x0b, 3) * (4 - x0b), 1e-15);
  EXPECT_NEAR(2 * one.pinv()(0, 0), 1.0, 1e-15);
}

TEST(NewtonSchulzPinv, ConvergesToMoorePenroseOnWellConditioned) {
  for (Eigen::Index m : {1, 5, 32, 64}) {
    const Md c = softmax_matrix(m, 1.0, 10 + m) + Md::Identity(m, m);  // diagonally dominant
    const Md exact = pinv_svd(c);
    NewtonSchulzPinv<double> ns(20);
    ns.compute(c);
    EXPECT_EQ(ns.info(), PinvInfo::kSuccess) << m;
    EXPECT_LT(ns.residual(), 1e-10) << m;
    EXPECT_LT((ns.pinv() - exact).norm() / exact.norm(), 1e-12) << m;
    NewtonSchulzPinv<float> nf(20);
    nf.compute(c.cast<float>());
    EXPECT_EQ(nf.info(), PinvInfo::kSuccess) << m;
    EXPECT_LT((nf.pinv().cast<double>() - exact).norm() / exact.norm(), 1e-5) << m;
  }
  // Rectangular, full row rank: Z → C⁺ (a right inverse).
  const Md r = randn(6, 9, 3);
  NewtonSchulzPinv<double> ns(40);
  ns.compute(r);
  EXPECT_EQ(ns.info(), PinvInfo::kSuccess);
  EXPECT_LT((ns.pinv() - pinv_svd(r)).norm(), 1e-10);
  // Tall: a left inverse, the residual is ‖I − ZC‖.
  NewtonSchulzPinv<double> nt(40);
  nt.compute(r.transpose());
  EXPECT_EQ(nt.info(), PinvInfo::kSuccess);
  EXPECT_LT((nt.pinv() - pinv_svd(r.transpose())).norm(), 1e-10);
}

TEST(NewtonSchulzPinv, ResidualFallsMonotonicallyAndCubically) {
  const Md c = with_singular_values(Eigen::VectorXd::LinSpaced(16, 1.0, 0.5), 40);
  double prev = 1e300;
  std::vector<double> res;
  for (int it = 0; it <= 12; ++it) {
    NewtonSchulzPinv<double> ns(it);
    ns.compute(c);
    res.push_back(ns.residual());
    EXPECT_LE(ns.residual(), prev * (1 + 1e-12) + 1e-14) << it;
    prev = ns.residual();
  }
  EXPECT_LT(res[12], 1e-12);
  // CZ = U·diag(x)·Uᵀ, so ‖I − CZ‖_F² = Σ(1 − xᵢ)² and each 1 − xᵢ at least cubes: res' ≤ res³.
  for (int it = 0; it < 12; ++it) EXPECT_LE(res[it + 1], std::pow(res[it], 3) + 1e-13) << it;
}

TEST(NewtonSchulzPinv, ReportsNonConvergenceWhenIllConditioned) {
  Eigen::VectorXd sigma = Eigen::VectorXd::LinSpaced(24, 0, -8);  // κ = 1e8
  for (Eigen::Index i = 0; i < sigma.size(); ++i) sigma(i) = std::pow(10.0, sigma(i));
  const Md c = with_singular_values(sigma, 50);
  NewtonSchulzPinv<double> ns;  // 6 iterations, the papers' default
  ns.compute(c);
  EXPECT_EQ(ns.info(), PinvInfo::kNoConvergence);
  EXPECT_GT(ns.residual(), 1.0);
  EXPECT_TRUE(ns.pinv().allFinite());
  // Still a damped inverse: ‖Z‖ does not exceed ‖C⁺‖ (every x stays in (0, 1]).
  EXPECT_LE(dense::spectral_norm(ns.pinv(), dense::SvdAlgorithm::kJacobi), 1e8 * (1 + 1e-6));
  // Rank-deficient: never a one-sided inverse, but Z → C⁺ with enough steps.
  Md low = Md::Zero(10, 10);  // exactly rank 3 (a rounding-level σ would be inverted too)
  low.topLeftCorner(3, 3) = randn(3, 3, 60) + 4 * Md::Identity(3, 3);
  NewtonSchulzPinv<double> nl(60);
  nl.compute(low);
  EXPECT_EQ(nl.info(), PinvInfo::kNoConvergence);
  EXPECT_LT((nl.pinv() - pinv_svd(low, 1e-10)).norm() / pinv_svd(low, 1e-10).norm(), 1e-8);
}

TEST(NewtonSchulzPinv, RowStochasticScalingIsTheOfficialInitialisation) {
  const Md c = softmax_matrix(32, 3.0, 70);
  ASSERT_NEAR(c.rowwise().sum().maxCoeff(), 1.0, 1e-14);  // ‖C‖∞ = 1
  NewtonSchulzPinv<double> z0(0);
  z0.compute(c);
  const Md official = c.transpose() / c.colwise().sum().maxCoeff();  // Cᵀ / max column sum
  EXPECT_LT((z0.pinv() - official).norm(), 1e-15 * official.norm());
  // And with it, the default 6 iterations invert a moderately conditioned softmax kernel.
  const Md f2 = softmax_matrix(16, 0.5, 71) * 0.5 + Md::Identity(16, 16) * 0.5;
  NewtonSchulzPinv<float> ns;
  ns.compute(f2.cast<float>());
  EXPECT_EQ(ns.info(), PinvInfo::kSuccess) << ns.residual();
}

TEST(NewtonSchulzPinv, EdgeCases) {
  NewtonSchulzPinv<double> ns;
  ns.compute(Md::Zero(3, 4));
  EXPECT_TRUE(ns.pinv().isZero());
  EXPECT_EQ(ns.pinv().rows(), 4);
  Md bad = Md::Identity(3, 3);
  bad(1, 2) = std::nan("");
  ns.compute(bad);
  EXPECT_EQ(ns.info(), PinvInfo::kNumericalIssue);
  EXPECT_FALSE(ns.pinv().allFinite());
  EXPECT_FALSE(pinv_svd(bad).allFinite());
}

TEST(PinvSvd, IsMoorePenrose) {
  const Md c = randn(7, 4, 80) * randn(4, 5, 81);  // rank 4
  const Md z = pinv_svd(c);
  EXPECT_LT((c * z * c - c).norm(), 1e-12 * c.norm());
  EXPECT_LT((z * c * z - z).norm(), 1e-12 * z.norm());
  EXPECT_LT((c * z - (c * z).transpose()).norm(), 1e-12);
  EXPECT_LT((z * c - (z * c).transpose()).norm(), 1e-12);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::decomp
