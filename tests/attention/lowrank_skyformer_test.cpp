// lowrank.skyformer: against a dense float64 transcription of the official algorithm with the
// method's own landmark draws (exact and Newton–Schulz pseudo-inverse), the limit case (all 2N rows,
// γ = 0, exact pinv = the Gaussian target), the block bound ‖A − Â‖ ≤ ‖B − B̂‖
// in float64, error falling with the landmarks (median over seeds), the landmark sample, refusals.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "attention/lowrank/skyformer.h"
#include "attention/lowrank_test_util.h"

namespace numattn::test {
namespace {
namespace NUMATTN_UNITY_ID {

/// Gaussian kernel matrix exp(−‖x_i − y_j‖²/2) of the rows of x and y (already scaled by sqrt(s)).
Mat gauss(const Mat& x, const Mat& y) {
  Mat k(x.rows(), y.rows());
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < y.rows(); ++j) k(i, j) = std::exp(-0.5 * (x.row(i) - y.row(j)).squaredNorm());
  return k;
}

Mat newton_schulz(const Mat& c, int iters) {
  const double n1 = c.cwiseAbs().colwise().sum().maxCoeff(), ni = c.cwiseAbs().rowwise().sum().maxCoeff();
  Mat z = c.transpose() / (n1 * ni);
  const Mat I = Mat::Identity(c.rows(), c.rows());
  for (int k = 0; k < iters; ++k) {
    const Mat cz = c * z;
    z = 0.25 * z * (13 * I - cz * (15 * I - cz * (7 * I - cz)));
  }
  return z;
}

/// The official algorithm for one head, then rows normalised by Â·1.
Mat skyformer_dense(const Mat& q, const Mat& k, const Mat& v, double s, const std::vector<index_t>& qs,
                    const std::vector<index_t>& ks, double gamma, bool exact, int iters) {
  const Mat xq = q * std::sqrt(s), xk = k * std::sqrt(s);
  Mat xs(static_cast<Eigen::Index>(qs.size() + ks.size()), q.cols());
  Eigen::Index r = 0;
  for (index_t i : qs) xs.row(r++) = xq.row(i);
  for (index_t j : ks) xs.row(r++) = xk.row(j);
  Mat stas = gauss(xs, xs) + gamma * Mat::Identity(xs.rows(), xs.rows());
  const Eigen::VectorXd d = stas.rowwise().sum().array().rsqrt();
  stas = d.asDiagonal() * stas * d.asDiagonal();
  const Mat z = exact ? Mat(decomp::dense::pinv(stas)) : newton_schulz(stas, iters);
  const Mat ahat = gauss(xq, xs) * d.asDiagonal() * z * d.asDiagonal() * gauss(xk, xs).transpose();
  const Eigen::VectorXd den = ahat.rowwise().sum();
  return (ahat * v).array().colwise() / den.array();
}

TEST(LowrankSkyformer, MatchesDenseFloat64Transcription) {
  for (const char* pinv : {"exact", "newton_schulz"}) {
    RandomProblem prob(small_config(4, 2, 60, 80, 16, base_seed() + 1, 0.7));
    auto m = create_method(fmt::format("lowrank.skyformer(landmarks=40,gamma=0.1,pinv={},seed=3)", pinv));
    m->run(prob.problem(), ExecContext{2});
    const AttentionProblem& p = prob.problem();
    const auto& sky = dynamic_cast<const SkyformerAttention&>(*m);
    for (index_t h = 0; h < 4; ++h) {
      const auto lm = sky.landmarks(p, 0, h);
      const Mat want = skyformer_dense(head_matrix(p.q, 0, h), head_matrix(p.k, 0, h / 2), head_matrix(p.v, 0, h / 2),
                                       p.effective_scale(), lm.q_rows, lm.k_rows, 0.1, std::string(pinv) == "exact", 6);
      EXPECT_LT(rel_fro(head_matrix(p.out, 0, h), want), 2e-4) << pinv << " head " << h;
    }
  }
}

TEST(LowrankSkyformer, AllRowsWithoutRegularisationIsTheGaussianTarget) {
  RandomProblem prob(small_config(2, 1, 30, 50, 12, base_seed() + 2, 2.0));
  auto m = create_method("lowrank.skyformer(landmarks=80,gamma=0,pinv=exact)");
  m->run(prob.problem(), ExecContext{2});
  const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}, m->target()));
  EXPECT_EQ(m->target().name(), "gaussian");
  EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error);
  EXPECT_LE(e.max_scaled_error, exact_f32_tolerance(e.logit_magnitude).max_scaled_error);
  // The same 2N landmarks through the float64 Nyström formula reproduce A (B̂ = B·B⁺·B = B).
  const AttentionProblem& p = prob.problem();
  std::vector<index_t> all_q(30), all_k(50);
  std::iota(all_q.begin(), all_q.end(), index_t{0});
  std::iota(all_k.begin(), all_k.end(), index_t{0});
  const Mat dense = skyformer_dense(head_matrix(p.q, 0, 1), head_matrix(p.k, 0, 0), head_matrix(p.v, 0, 0),
                                    p.effective_scale(), all_q, all_k, 0.0, true, 0);
  EXPECT_LT(rel_fro(head_matrix(p.out, 0, 1), dense), 1e-5);
}

TEST(LowrankSkyformer, BlockBoundOfTheSymmetrisation) {
  // Block bound: for any B̂ (here Nyström with random landmarks and γ), its off-diagonal block Â
  // satisfies ‖A − Â‖ ≤ ‖B − B̂‖ in the Frobenius and spectral norms.
  RandomProblem prob(small_config(1, 1, 40, 40, 8, base_seed() + 3));
  const double s = prob.problem().effective_scale();
  const Mat xq = head_matrix(prob.problem().q, 0, 0) * std::sqrt(s), xk = head_matrix(prob.problem().k, 0, 0) * std::sqrt(s);
  Mat x(80, 8);
  x << xq, xk;
  const Mat b = gauss(x, x);
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<Eigen::Index> sel;
    for (Eigen::Index i = trial; i < 80; i += 7 + trial) sel.push_back(i);
    Mat bs(80, static_cast<Eigen::Index>(sel.size()));
    for (std::size_t c = 0; c < sel.size(); ++c) bs.col(static_cast<Eigen::Index>(c)) = b.col(sel[c]);
    Mat bss(bs.cols(), bs.cols());
    for (std::size_t r = 0; r < sel.size(); ++r) bss.row(static_cast<Eigen::Index>(r)) = bs.row(sel[r]);
    const double gamma = 0.05 * trial;
    bss += gamma * Mat::Identity(bss.rows(), bss.rows());
    const Mat bhat = bs * Mat(decomp::dense::pinv(bss)) * bs.transpose();
    const Mat da = b.topRightCorner(40, 40) - bhat.topRightCorner(40, 40), db = b - bhat;
    EXPECT_LE(da.norm(), db.norm() * (1 + 1e-12)) << trial;
    const auto spec = [](const Mat& m) { return decomp::dense::spectral_norm(m, decomp::dense::SvdAlgorithm::kJacobi); };
    EXPECT_LE(spec(da), spec(db) * (1 + 1e-12)) << trial;
  }
}

TEST(LowrankSkyformer, ErrorFallsAsLandmarksGrow) {
  const std::vector<int> ms = {4, 16, 64, 256};
  std::vector<double> med;
  for (int m : ms) {
    std::vector<double> e;
    for (int s = 1; s <= 5; ++s) {
      RandomProblem prob(small_config(2, 2, 128, 128, 16, base_seed() + 30 + s));
      e.push_back(run_error(fmt::format("lowrank.skyformer(landmarks={},seed={})", m, s), prob));
    }
    med.push_back(median(e));
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "m=" << ms[i];
  EXPECT_LT(med.back(), 0.1 * med.front());
}

TEST(LowrankSkyformer, LandmarksAreHalfQueriesHalfKeysSeeded) {
  RandomProblem prob(small_config(2, 1, 50, 70, 8, 1));
  const AttentionProblem& p = prob.problem();
  auto a = create_method("lowrank.skyformer(landmarks=21,seed=4)");
  const auto& sa = dynamic_cast<const SkyformerAttention&>(*a);
  const auto l0 = sa.landmarks(p, 0, 0);
  EXPECT_EQ(l0.q_rows.size(), 10u);
  EXPECT_EQ(l0.k_rows.size(), 11u);
  EXPECT_EQ(std::set<index_t>(l0.q_rows.begin(), l0.q_rows.end()).size(), 10u);
  EXPECT_EQ(std::set<index_t>(l0.k_rows.begin(), l0.k_rows.end()).size(), 11u);
  EXPECT_EQ(sa.landmarks(p, 0, 0).q_rows, l0.q_rows);  // same seed, same draw
  EXPECT_NE(sa.landmarks(p, 0, 1).q_rows, l0.q_rows);  // per head
  const auto b = create_method("lowrank.skyformer(landmarks=21,seed=5)");
  const auto& sb = dynamic_cast<const SkyformerAttention&>(*b);
  EXPECT_NE(sb.landmarks(p, 0, 0).k_rows, l0.k_rows);  // per seed
  // More landmarks than one side has: the rest come from the other side.
  RandomProblem small(small_config(1, 1, 3, 40, 8, 1));
  const auto ls = dynamic_cast<const SkyformerAttention&>(*create_method("lowrank.skyformer(landmarks=20)")).landmarks(small.problem(), 0, 0);
  EXPECT_EQ(ls.q_rows.size(), 3u);
  EXPECT_EQ(ls.k_rows.size(), 17u);
}

TEST(LowrankSkyformer, Refusals) {
  ProblemConfig cfg = small_config(2, 2, 16, 16, 8, 1);
  cfg.causal = Causal::kTopLeft;  // by the causal recursion (method.h), on the Gaussian target
  RandomProblem a(cfg);
  EXPECT_TRUE(create_method("lowrank.skyformer")->runs_by_recursion(a.problem()));
  EXPECT_TRUE(create_method("lowrank.skyformer")->can_run(a.problem()).is_ok());
  cfg.causal = Causal::kNone;
  cfg.scale = -0.5;
  RandomProblem b(cfg);
  EXPECT_NE(create_method("lowrank.skyformer")->can_run(b.problem()).reason().find("positive scale"), std::string::npos);
  cfg.scale = 1e36;
  RandomProblem c(cfg);
  const Status st = create_method("lowrank.skyformer")->can_run(c.problem());
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.reason().find("1e+06"), std::string::npos) << st.reason();
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::test
