// lowrank.svd: against a dense float64 transcription (masked softmax matrix, Jacobi SVD,
// P_r·V), the bound ‖(P − P_r)V‖₂ ≤ σ_{r+1}‖V‖₂, the full-rank limit with masks and causal
// alignments, error falling with the rank, the memory refusal.
#include <gtest/gtest.h>

#include <limits>

#include "attention/lowrank_test_util.h"

namespace numattn::test {
namespace {
namespace NUMATTN_UNITY_ID {

/// The masked softmax matrix of head (b, h): rows that see no key are 0 (problem.h).
Mat softmax_matrix(const AttentionProblem& p, index_t b, index_t h) {
  const Mat q = head_matrix(p.q, b, h), k = head_matrix(p.k, b, h / p.group());
  Mat s = q * k.transpose() * p.effective_scale();
  Mat out = Mat::Zero(s.rows(), s.cols());
  for (Eigen::Index i = 0; i < s.rows(); ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    for (Eigen::Index j = 0; j < s.cols(); ++j) {
      bool vis = p.visible(i, j);
      if (vis && p.mask.kind == MaskKind::kAdditive) {
        const float a = p.mask.additive[i * p.mask.ld + j];
        vis = a > -std::numeric_limits<float>::infinity();
        if (vis) s(i, j) += a;
      }
      if (!vis) s(i, j) = -std::numeric_limits<double>::infinity();
      mx = std::max(mx, s(i, j));
    }
    if (mx == -std::numeric_limits<double>::infinity()) continue;
    out.row(i) = (s.row(i).array() - mx).exp().matrix();
    out.row(i) /= out.row(i).sum();
  }
  return out;
}

TEST(LowrankSvd, MatchesDenseFloat64Transcription) {
  ProblemConfig cfg = small_config(4, 2, 40, 56, 16, base_seed() + 1, 2.0);
  cfg.dv = 8;
  RandomProblem prob(cfg);
  std::vector<float> add(40 * 56);
  for (std::size_t x = 0; x < add.size(); ++x) add[x] = x % 7 == 0 ? -std::numeric_limits<float>::infinity() : 0.1f * static_cast<float>(x % 5);
  prob.set_additive_mask(add);
  const AttentionProblem& p = prob.problem();
  for (int r : {1, 5, 17}) {
    create_method(fmt::format("lowrank.svd(rank={})", r))->run(p, ExecContext{2});
    for (index_t h = 0; h < 4; ++h) {
      const Mat pm = softmax_matrix(p, 0, h), v = head_matrix(p.v, 0, h / 2);
      // One-sided Jacobi: not the method's divide-and-conquer SVD.
      const decomp::dense::Svd svd = decomp::dense::svd(pm, true, decomp::dense::SvdAlgorithm::kJacobi);
      const Mat pr = svd.u.leftCols(r) * svd.s.head(r).asDiagonal() * svd.vt.topRows(r);
      const Mat want = pr * v, got = head_matrix(p.out, 0, h);
      EXPECT_LT(rel_fro(got, want), 1e-6) << "r=" << r << " h=" << h;
      // Eckart–Young: ‖P − P_r‖_F² is the tail energy; the output error is ≤ σ_{r+1}·‖V‖₂.
      const Eigen::VectorXd sv = svd.s;
      EXPECT_NEAR((pm - pr).squaredNorm(), sv.tail(sv.size() - r).squaredNorm(), 1e-10);
      const Mat exact = pm * v;
      const double vnorm = decomp::dense::spectral_norm(v);
      EXPECT_LE(decomp::dense::spectral_norm(got - exact), sv(r) * vnorm * (1 + 1e-5) + 1e-6);
    }
  }
}

TEST(LowrankSvd, FullRankIsExactWithMasksAndCausalAlignments) {
  const auto exact_run = [](RandomProblem& prob, const std::string& what) {
    create_method("lowrank.svd(rank=450)")->run(prob.problem(), ExecContext{3});
    const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
    EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error) << what;
    EXPECT_LE(e.max_scaled_error, exact_f32_tolerance(e.logit_magnitude).max_scaled_error) << what;
  };
  {
    RandomProblem prob(small_config(2, 1, 30, 45, 12, base_seed() + 2, 4.0));
    std::vector<std::uint8_t> allowed(30 * 45);
    for (std::size_t x = 0; x < allowed.size(); ++x) allowed[x] = x % 5 != 2 && x / 45 != 3;  // row 3 empty
    prob.set_bool_mask(allowed);
    exact_run(prob, "boolean mask");
  }
  // Causal rules and windows: by the causal recursion (its blocks at full rank are exact).
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
    ProblemConfig cfg = small_config(2, 1, 300, 450, 12, base_seed() + 2, 4.0);
    cfg.causal = c;
    RandomProblem prob(cfg);
    EXPECT_TRUE(create_method("lowrank.svd")->runs_by_recursion(prob.problem()));
    exact_run(prob, to_string(c));
  }
  // A mask on a causal problem would have to reach the recursion's blocks: refused, with a reason.
  ProblemConfig cfg = small_config(2, 1, 30, 45, 12, base_seed() + 2, 4.0);
  cfg.causal = Causal::kTopLeft;
  RandomProblem prob(cfg);
  prob.set_bool_mask(std::vector<std::uint8_t>(30 * 45, 1));
  const Status s = create_method("lowrank.svd")->can_run(prob.problem());
  EXPECT_FALSE(s.is_ok());
  EXPECT_FALSE(s.reason().empty());
}

TEST(LowrankSvd, ErrorFallsAsRankGrows) {
  const std::vector<int> ranks = {1, 4, 16, 64, 128};
  std::vector<double> med;
  for (int r : ranks) {
    std::vector<double> e;
    for (int s = 0; s < 3; ++s) {
      RandomProblem prob(small_config(2, 2, 128, 128, 32, base_seed() + 20 + s, 2.0, Dist::kSpiky));
      e.push_back(run_error(fmt::format("lowrank.svd(rank={})", r), prob));
    }
    med.push_back(median(e));
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "rank " << ranks[i];
  EXPECT_LT(med.back(), 1e-5);
}

TEST(LowrankSvd, RefusesWhatDoesNotFitWithTheSize) {
  ProblemConfig cfg = small_config(1, 1, 8200, 8200, 1, 1);
  RandomProblem prob(cfg);
  const Status s = create_method("lowrank.svd")->can_run(prob.problem());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.reason().find("67240000 entries"), std::string::npos) << s.reason();
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::test
