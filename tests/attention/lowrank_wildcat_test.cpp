// lowrank.wildcat against a float64 transcription of WILDCAT (Schröder & Mackey 2026): the same
// RPCholesky pivots (same seed and stream), dense Nyström weights
// W = exp(β/τ²·K_SK_Sᵀ)⁻¹exp(β/τ²·K_SKᵀ) by LU, Ŷ = exp(βQK_Sᵀ)(WV) / exp(βQK_Sᵀ)(W1); the block
// bound ‖A − Â‖ ≤ ‖B − B̂‖ of the off-diagonal block; the limit case; error falling with the rank;
// determinism per seed and thread count.
#include <gtest/gtest.h>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/lowrank/wildcat.h"
#include "numattn/attention/registry.h"
#include "numattn/decomp/dense.h"
#include "numattn/decomp/rpcholesky.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using Mat = Eigen::MatrixXd;

Mat rows_of(const TensorView<const float>& t, index_t b, index_t h, index_t n) {
  Mat m(n, t.shape[3]);
  for (index_t j = 0; j < n; ++j)
    for (index_t c = 0; c < t.shape[3]; ++c) m(j, c) = t(b, h, j, c);
  return m;
}

Mat exp_of(const Mat& x) { return x.array().exp().matrix(); }

/// Pivots of RPCholesky on G = exp(c·KKᵀ) (dense, unweighted) with the method's draws.
std::vector<index_t> pivots(const Mat& K, double c, index_t r, std::uint64_t seed, std::uint64_t stream) {
  const Mat G = exp_of(c * K * K.transpose());
  std::vector<double> diag(static_cast<std::size_t>(K.rows()));
  for (index_t i = 0; i < K.rows(); ++i) diag[static_cast<std::size_t>(i)] = G(i, i);
  decomp::RpCholeskyOptions opt;
  opt.rank = r;
  opt.seed = seed;
  opt.stream = stream;
  return decomp::rp_cholesky(K.rows(), diag, [&](index_t j, double* col) {
    for (index_t i = 0; i < K.rows(); ++i) col[i] = G(i, j);
  }, opt).pivots;
}

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, Dist dist, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d + 2, Causal::kNone, seed, dist);
}

TEST(Wildcat, EqualsItsFloat64Transcription) {
  for (double tau : {1.5, 0.0}) {
    RandomProblem prob(config(4, 2, 40, 60, 8, Dist::kGaussian, test::base_seed()));
    const AttentionProblem& p = prob.problem();
    const index_t r = 14;
    const std::uint64_t seed = 3;
    auto m = create_method(fmt::format("lowrank.wildcat(rank={},tau={},seed={})", r, tau, seed));
    m->run(p, ExecContext{2});
    EXPECT_EQ(dynamic_cast<const WildcatAttention&>(*m).fallback_rows(), 0);
    const double beta = p.effective_scale();
    double num = 0, den = 0;
    for (index_t hk = 0; hk < 2; ++hk) {
      const Mat K = rows_of(p.k, 0, hk, 60), V = rows_of(p.v, 0, hk, 60);
      double rq = 0;
      for (index_t h = 2 * hk; h < 2 * hk + 2; ++h) rq = std::max(rq, rows_of(p.q, 0, h, 40).rowwise().norm().maxCoeff());
      const double tau2 = tau > 0 ? tau * tau : 2 * K.rowwise().norm().maxCoeff() / rq;
      const double c = beta / tau2;
      const std::vector<index_t> S = pivots(K, c, r, seed, static_cast<std::uint64_t>(hk));
      ASSERT_EQ(static_cast<index_t>(S.size()), r);
      Mat KS(r, 8);
      for (index_t t = 0; t < r; ++t) KS.row(t) = K.row(S[static_cast<std::size_t>(t)]);
      const Mat W = decomp::dense::lu_solve(exp_of(c * KS * KS.transpose()), exp_of(c * KS * K.transpose())).x;
      const Mat WV = W * V;
      const Eigen::VectorXd W1 = W.rowwise().sum();
      for (index_t h = 2 * hk; h < 2 * hk + 2; ++h) {
        const Mat A = exp_of(beta * rows_of(p.q, 0, h, 40) * KS.transpose());
        const Mat Y = (A * WV).array().colwise() / (A * W1).array();
        for (index_t i = 0; i < 40; ++i)
          for (index_t u = 0; u < 10; ++u) {
            const double e = p.out(0, h, i, u) - Y(i, u);
            num += e * e;
            den += Y(i, u) * Y(i, u);
          }
      }
    }
    EXPECT_LT(std::sqrt(num / den), 1e-4) << "tau=" << tau;
  }
}

TEST(Wildcat, OffDiagonalBlockBound) {
  // Block bound: Â = exp(βQK_Sᵀ)·W is the (Q, K) block of the Nyström approximation B̂ of
  // B = κ([τQ; K/τ]) with landmarks K_S, so ‖A − Â‖_F ≤ ‖B − B̂‖_F (and in the spectral norm).
  RandomProblem prob(config(1, 1, 30, 50, 6, Dist::kSpiky, test::base_seed() + 1));
  const AttentionProblem& p = prob.problem();
  const Mat Q = rows_of(p.q, 0, 0, 30), K = rows_of(p.k, 0, 0, 50);
  const double beta = p.effective_scale(), tau = 1.3, c = beta / (tau * tau);
  for (index_t r : {3, 10, 25}) {
    const std::vector<index_t> S = pivots(K, c, r, 1, 0);
    Mat X(80, 6);
    X << tau * Q, K / tau;
    const Mat B = exp_of(beta * X * X.transpose());
    Mat BS(80, static_cast<index_t>(S.size()));
    for (std::size_t t = 0; t < S.size(); ++t) BS.col(static_cast<index_t>(t)) = B.col(30 + S[t]);
    Mat BSS(static_cast<index_t>(S.size()), static_cast<index_t>(S.size()));
    for (std::size_t t = 0; t < S.size(); ++t)
      for (std::size_t u = 0; u < S.size(); ++u) BSS(static_cast<index_t>(t), static_cast<index_t>(u)) = B(30 + S[t], 30 + S[u]);
    const Mat Bh = BS * decomp::dense::lu_solve(BSS, BS.transpose()).x;
    const Mat A = B.block(0, 30, 30, 50), Ah = Bh.block(0, 30, 30, 50);
    EXPECT_LE((A - Ah).norm(), (B - Bh).norm() * (1 + 1e-9)) << r;
    EXPECT_LE(decomp::dense::spectral_norm(A - Ah), decomp::dense::spectral_norm(B - Bh) * (1 + 1e-9)) << r;
  }
}

TEST(Wildcat, FullRankIsExactAttention) {
  RandomProblem prob(config(6, 2, 33, 45, 16, Dist::kSpiky, test::base_seed() + 2));
  create_method("lowrank.wildcat(rank=45)")->run(prob.problem(), ExecContext{3});
  const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
  const ExactTolerance tol = exact_f32_tolerance(e.logit_magnitude);
  EXPECT_LE(e.rel_fro_error, tol.rel_fro_error);
  EXPECT_LE(e.max_scaled_error, tol.max_scaled_error);
}

TEST(Wildcat, ErrorFallsAsTheRankGrows) {
  RandomProblem prob(config(2, 2, 64, 256, 16, Dist::kSpiky, test::base_seed() + 3));
  const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
  std::vector<double> med;
  for (index_t r : {4, 16, 64, 256}) {
    std::vector<double> e;
    for (int seed = 1; seed <= 5; ++seed) {
      create_method(fmt::format("lowrank.wildcat(rank={},seed={})", r, seed))->run(prob.problem(), ExecContext{2});
      e.push_back(compare_with_reference(prob.problem(), ref).rel_fro_error);
    }
    std::sort(e.begin(), e.end());
    med.push_back(e[2]);
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "step " << i;
  EXPECT_LT(med.back(), 1e-5);
}

TEST(Wildcat, DeterministicPerSeedWhateverTheThreadCount) {
  RandomProblem prob(config(4, 2, 70, 150, 16, Dist::kGaussian, test::base_seed() + 4));
  auto run = [&](const std::string& spec, int threads) {
    create_method(spec)->run(prob.problem(), ExecContext{threads});
    return prob.out_data();
  };
  const std::vector<float> a = run("lowrank.wildcat(rank=20,seed=5)", 1);
  EXPECT_EQ(a, run("lowrank.wildcat(rank=20,seed=5)", 3));
  EXPECT_NE(a, run("lowrank.wildcat(rank=20,seed=6)", 1));
}

TEST(Wildcat, RunsCausalByTheRecursionAndRefusesMasks) {
  ProblemConfig cfg = config(1, 1, 8, 8, 4, Dist::kGaussian, 1);
  cfg.causal = Causal::kTopLeft;
  RandomProblem prob(cfg);
  const auto m = create_method("lowrank.wildcat");
  EXPECT_TRUE(m->runs_by_recursion(prob.problem()));
  EXPECT_TRUE(m->can_run(prob.problem()).is_ok());
  prob.set_bool_mask(std::vector<std::uint8_t>(64, 1));
  const Status s = m->can_run(prob.problem());
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.reason().find("boolean masks"), std::string::npos) << s.reason();
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
