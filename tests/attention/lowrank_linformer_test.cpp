// lowrank.linformer: against a dense float64 transcription softmax(Q(EK)ᵀ)(EV) with the method's
// own draws of E, the identity limit, the JL properties of E (E[EᵀE] = I, inner products of
// projected columns converging as k grows, median over seeds), the CountSketch structure,
// refusals, determinism; and the finding that the output does not converge with k.
#include <gtest/gtest.h>

#include "attention/lowrank/linformer.h"
#include "attention/lowrank_test_util.h"

namespace numattn::test {
namespace {
namespace NUMATTN_UNITY_ID {

const LinformerAttention& as_linformer(const AttentionMethod& m) { return dynamic_cast<const LinformerAttention&>(m); }

Mat projection(const AttentionMethod& m, index_t hk, index_t nk, index_t k) {
  const std::vector<float> e = as_linformer(m).projection_matrix(hk, nk);
  return Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>>(e.data(), k, nk).cast<double>();
}

TEST(LowrankLinformer, MatchesDenseFloat64TranscriptionWithItsDraws) {
  for (const char* proj : {"gaussian", "sparse"}) {
    RandomProblem prob(small_config(4, 2, 50, 120, 16, base_seed() + 1, 0.3));
    auto m = create_method(fmt::format("lowrank.linformer(k=24,projection={},seed=5)", proj));
    m->run(prob.problem(), ExecContext{2});
    const AttentionProblem& p = prob.problem();
    for (index_t h = 0; h < 4; ++h) {
      const Mat e = projection(*m, h / 2, 120, 24);
      const Mat kp = e * head_matrix(p.k, 0, h / 2), vp = e * head_matrix(p.v, 0, h / 2);
      const Mat want = row_softmax(p.effective_scale() * head_matrix(p.q, 0, h) * kp.transpose()) * vp;
      EXPECT_LT(rel_fro(head_matrix(p.out, 0, h), want), 1e-5) << proj << " head " << h;
    }
  }
}

TEST(LowrankLinformer, IdentityWithKEqualNkIsExact) {
  RandomProblem prob(small_config(4, 1, 33, 77, 20, base_seed() + 2, 4.0));
  create_method("lowrank.linformer(k=77,projection=identity)")->run(prob.problem(), ExecContext{2});
  const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
  EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error);
  EXPECT_LE(e.max_scaled_error, exact_f32_tolerance(e.logit_magnitude).max_scaled_error);
}

TEST(LowrankLinformer, ProjectionsAreJohnsonLindenstrauss) {
  const index_t nk = 200;
  for (const char* proj : {"gaussian", "sparse"}) {
    // E[EᵀE] = I: averaged over 20 seeds the Gram matrix of E is close to the identity.
    Mat gram = Mat::Zero(nk, nk);
    for (int s = 0; s < 20; ++s) {
      const Mat e = projection(*create_method(fmt::format("lowrank.linformer(k=64,projection={},seed={})", proj, s)), 0, nk, 64);
      gram += e.transpose() * e / 20.0;
    }
    // Off-diagonal entries have variance 1/(k·seeds) = 1/1280 for both constructions.
    const Mat off = gram - Mat::Identity(nk, nk);
    EXPECT_LT(off.squaredNorm() / static_cast<double>(nk * nk), 1.5 / 1280.0) << proj;
    EXPECT_NEAR(gram.diagonal().mean(), 1.0, 0.02) << proj;
    // Inner products of projected columns of K (d×d Gram of EK vs K): the relative error falls
    // like 1/sqrt(k) (median over 7 seeds).
    RandomProblem prob(small_config(1, 1, 1, nk, 8, base_seed() + 3));
    const Mat k = head_matrix(prob.problem().k, 0, 0), g = k.transpose() * k;
    std::vector<double> med;
    for (int kk : {8, 32, 128, 512}) {
      std::vector<double> errs;
      for (int s = 0; s < 7; ++s) {
        const Mat e = projection(*create_method(fmt::format("lowrank.linformer(k={},projection={},seed={})", kk, proj, s)), 0, nk, kk);
        errs.push_back(rel_fro((e * k).transpose() * (e * k), g));
      }
      med.push_back(median(errs));
    }
    for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << proj << " step " << i;
    EXPECT_LT(med.back(), 0.25 * med.front()) << proj;
  }
}

TEST(LowrankLinformer, SparseProjectionIsASignedCountSketch) {
  auto m = create_method("lowrank.linformer(k=16,projection=sparse,seed=3)");
  const Mat e = projection(*m, 1, 300, 16);
  for (Eigen::Index j = 0; j < 300; ++j) {
    EXPECT_EQ((e.col(j).array() != 0).count(), 1) << j;
    EXPECT_EQ(e.col(j).cwiseAbs().sum(), 1.0) << j;
  }
  // Different kv heads and seeds draw different sketches.
  EXPECT_NE(e, projection(*m, 0, 300, 16));
  EXPECT_NE(e, projection(*create_method("lowrank.linformer(k=16,projection=sparse,seed=4)"), 1, 300, 16));
}

TEST(LowrankLinformer, OutputDoesNotConvergeWithK) {
  // The finding documented in linformer.h: even with k ≥ Nk a random E is far from exact, and
  // the error grows with Nk (median over 5 seeds).
  auto med_error = [](index_t n, int k) {
    std::vector<double> e;
    for (int s = 0; s < 5; ++s) {
      RandomProblem prob(small_config(2, 2, n, n, 32, base_seed() + 40 + s));
      e.push_back(run_error(fmt::format("lowrank.linformer(k={},seed={})", k, s), prob));
    }
    return median(e);
  };
  EXPECT_GT(med_error(128, 256), 0.5);
  EXPECT_GT(med_error(512, 256), med_error(128, 256));
}

TEST(LowrankLinformer, Refusals) {
  ProblemConfig cfg = small_config(2, 2, 16, 20, 8, 1);
  RandomProblem a(cfg);
  const Status id = create_method("lowrank.linformer(k=16,projection=identity)")->can_run(a.problem());
  ASSERT_FALSE(id.is_ok());
  EXPECT_NE(id.reason().find("k ≥ Nk"), std::string::npos) << id.reason();
  EXPECT_TRUE(create_method("lowrank.linformer(k=24,projection=identity)")->can_run(a.problem()).is_ok());
  // Causal: its kernel is non-causal; the causal recursion (method.h) runs it.
  cfg.causal = Causal::kTopLeft;
  RandomProblem b(cfg);
  const auto m = create_method("lowrank.linformer");
  EXPECT_TRUE(m->runs_by_recursion(b.problem()));
  EXPECT_TRUE(m->can_run(b.problem()).is_ok());
}

TEST(LowrankLinformer, DeterministicAcrossThreadCounts) {
  RandomProblem prob(small_config(2, 2, 100, 700, 16, base_seed() + 6));
  auto m = create_method("lowrank.linformer(k=40,seed=9)");
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
