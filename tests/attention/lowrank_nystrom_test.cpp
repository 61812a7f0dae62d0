// lowrank.nystrom: against a dense float64 transcription of Nyströmformer's formula (segment
// means with near-equal segments, the Newton–Schulz iteration written out here), the limit case
// m = Nk (exact softmax), error falling with m (median over seeds), non-causal refusal.
#include <gtest/gtest.h>

#include "attention/lowrank_test_util.h"
#include "numattn/decomp/pinv.h"

namespace numattn::test {
namespace {
namespace NUMATTN_UNITY_ID {

/// Segment means of the rows of x into m near-equal contiguous segments [⌊t·n/m⌋, ⌊(t+1)·n/m⌋).
Mat segment_means(const Mat& x, Eigen::Index m) {
  Mat out(m, x.cols());
  const Eigen::Index n = x.rows();
  for (Eigen::Index t = 0; t < m; ++t) {
    const Eigen::Index r0 = t * n / m, r1 = (t + 1) * n / m;
    out.row(t) = x.middleRows(r0, r1 - r0).colwise().mean();
  }
  return out;
}

/// Z₀ = Cᵀ/(‖C‖₁‖C‖∞), Z ← ¼ Z (13I − CZ(15I − CZ(7I − CZ))).
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

/// Ŷ = softmax(sQK̃ᵀ) · pinv(softmax(sQ̃K̃ᵀ)) · softmax(sQ̃Kᵀ) · V for one head.
Mat nystrom_dense(const Mat& q, const Mat& k, const Mat& v, double s, Eigen::Index m, bool exact, int iters) {
  const Mat qt = segment_means(q, std::min<Eigen::Index>(m, q.rows())), kt = segment_means(k, m);
  const Mat f1 = row_softmax(s * q * kt.transpose()), f2 = row_softmax(s * qt * kt.transpose()),
            f3 = row_softmax(s * qt * k.transpose());
  const Mat z = exact ? decomp::pinv_svd(f2, 1e-6) : newton_schulz(f2, iters);
  return f1 * (z * (f3 * v));
}

TEST(LowrankNystrom, MatchesDenseFloat64Transcription) {
  // Mild logits keep F2 well-conditioned, so float32 rounding stays small after the inverse.
  // N = 100 and 7 landmarks: segments of 14 and 15 rows (N not divisible by m).
  for (const char* pinv : {"newton_schulz", "exact"}) {
    RandomProblem prob(small_config(4, 2, 90, 100, 16, base_seed() + 1, 0.5));
    auto m = create_method(fmt::format("lowrank.nystrom(landmarks=7,pinv={},iters=6)", pinv));
    m->run(prob.problem(), ExecContext{2});
    const AttentionProblem& p = prob.problem();
    for (index_t h = 0; h < 4; ++h) {
      const Mat want = nystrom_dense(head_matrix(p.q, 0, h), head_matrix(p.k, 0, h / 2), head_matrix(p.v, 0, h / 2),
                                     p.effective_scale(), 7, std::string(pinv) == "exact", 6);
      EXPECT_LT(rel_fro(head_matrix(p.out, 0, h), want), 2e-5) << pinv << " head " << h;
    }
  }
}

TEST(LowrankNystrom, AllKeysAsLandmarksIsExact) {
  for (index_t nk : {1, 37, 64}) {
    RandomProblem prob(small_config(2, 1, 50, nk, 24, base_seed() + 2 + nk, 3.0));
    auto m = create_method(fmt::format("lowrank.nystrom(landmarks={})", nk));
    m->run(prob.problem(), ExecContext{2});
    const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
    const ExactTolerance tol = exact_f32_tolerance(e.logit_magnitude);
    EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << nk;
    EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << nk;
  }
}

TEST(LowrankNystrom, ErrorFallsAsLandmarksGrow) {
  // Smooth attention (small logits): the regime Nyström is meant for. Median over 5 problems.
  const std::vector<int> ms = {2, 8, 32, 128, 256};
  std::vector<double> med;
  for (int m : ms) {
    std::vector<double> e;
    for (int s = 0; s < 5; ++s) {
      RandomProblem prob(small_config(2, 2, 256, 256, 32, base_seed() + 10 + s, 0.5));
      e.push_back(run_error(fmt::format("lowrank.nystrom(landmarks={})", m), prob));
    }
    med.push_back(median(e));
  }
  for (std::size_t i = 1; i < med.size(); ++i)
    EXPECT_LE(med[i], med[i - 1] * 1.05) << "m=" << ms[i] << " median " << med[i] << " vs " << med[i - 1];
  EXPECT_LT(med[3], 0.5 * med[0]);
  EXPECT_LT(med.back(), 1e-5);
}

// Its kernel is non-causal (segment means mix future tokens): causal problems go to the causal
// recursion (method.h), tested for every method in auto_causal_test.cpp.
TEST(LowrankNystrom, RunsCausalProblemsByTheRecursion) {
  ProblemConfig cfg = small_config(2, 2, 16, 16, 8, 1);
  cfg.causal = Causal::kBottomRight;
  RandomProblem prob(cfg);
  const auto m = create_method("lowrank.nystrom");
  EXPECT_FALSE(m->info().caps.causal);
  EXPECT_TRUE(m->runs_by_recursion(prob.problem()));
  EXPECT_TRUE(m->can_run(prob.problem()).is_ok());
}

TEST(LowrankNystrom, DeterministicAcrossThreadCounts) {
  RandomProblem prob(small_config(3, 1, 300, 333, 32, base_seed() + 5));
  auto m = create_method("lowrank.nystrom(landmarks=20)");
  m->run(prob.problem(), ExecContext{1});
  const std::vector<float> one = prob.out_data();
  for (int t : {2, 3}) {
    m->run(prob.problem(), ExecContext{t});
    EXPECT_EQ(prob.out_data(), one) << t;
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::test
