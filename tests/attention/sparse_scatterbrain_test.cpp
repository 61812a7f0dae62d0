// sparse.scatterbrain (Chen et al., NeurIPS 2021): against a float64 transcription of Â = Q'K'ᵀ + S
// with the method's own collision pairs and Performer directions, where S_ij = A_ij − (Q'K'ᵀ)_ij
// makes Â equal A exactly on collision pairs (the unbiasedness identity) and the PRF estimate
// elsewhere; limits (chunk ≥ N: exact whatever φ; features = 0: pure sparse = sparse.reformer's
// union softmax); error falls as the chunk and the features grow; huge logits stay finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "attention/kernel/performer.h"
#include "attention/sparse/scatterbrain.h"
#include "numattn/attention/registry.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::median;
using test::run_error;

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d + 1, Causal::kNone, test::base_seed() + seed, Dist::kGaussian, false);
}

TEST(SparseScatterbrain, MatchesFloat64LowRankPlusSparse) {
  for (auto [n, nk, feats] : {std::tuple<index_t, index_t, index_t>{150, 150, 32}, {90, 140, 64}}) {
    ProblemConfig cfg = config(4, 2, n, nk, 16, 1);
    cfg.logit_scale = 0.7;
    RandomProblem prob(cfg);
    const AttentionProblem& p = prob.problem();
    const std::string spec = fmt::format("sparse.scatterbrain(features={},rounds=2,chunk=12,seed=4)", feats);
    const auto m = create_method(spec);
    m->run(p, ExecContext{3});
    const auto& sm = dynamic_cast<const ScatterbrainAttention&>(*m);
    const double s = p.effective_scale(), rs = std::sqrt(s);
    const index_t dk = p.d_qk(), dv = p.d_v();
    double err = 0, nrm = 0;
    for (index_t h = 0; h < p.heads(); ++h) {
      const index_t hk = h / p.group();
      const auto plan = sm.plan(p, 0, h);
      const std::vector<double> w = sm.directions(dk, hk);
      std::vector<double> x(dk), fq(feats), fk(static_cast<std::size_t>(nk * feats));
      for (index_t j = 0; j < nk; ++j) {
        for (index_t c = 0; c < dk; ++c) x[c] = rs * p.k(0, hk, j, c);
        PerformerAttention::features_f64(PerformerAttention::Kernel::kPositive, w, feats, x.data(), dk, fk.data() + j * feats);
      }
      for (index_t i = 0; i < n; ++i) {
        for (index_t c = 0; c < dk; ++c) x[c] = rs * p.q(0, h, i, c);
        PerformerAttention::features_f64(PerformerAttention::Kernel::kPositive, w, feats, x.data(), dk, fq.data());
        std::set<index_t> coll;
        for (const auto& R : plan)
          for (index_t t = R.window_begin(R.query_chunk[i]); t < R.window_end(R.query_chunk[i]); ++t) coll.insert(R.key_order[t]);
        std::vector<double> o(dv, 0.0);
        double z = 0;
        for (index_t j = 0; j < nk; ++j) {
          double a;
          if (coll.count(j)) {  // Q'K'ᵀ + S = A on a collision pair
            double d = 0;
            for (index_t c = 0; c < dk; ++c) d += double(p.q(0, h, i, c)) * p.k(0, hk, j, c);
            a = std::exp(s * d);
          } else {
            a = 0;
            for (index_t r = 0; r < feats; ++r) a += fq[r] * fk[j * feats + r];
          }
          z += a;
          for (index_t c = 0; c < dv; ++c) o[c] += a * p.v(0, hk, j, c);
        }
        for (index_t c = 0; c < dv; ++c) {
          err += std::pow(o[c] / z - p.out(0, h, i, c), 2);
          nrm += std::pow(o[c] / z, 2);
        }
      }
    }
    EXPECT_LT(std::sqrt(err / nrm), 1e-4) << spec;
  }
}

TEST(SparseScatterbrain, Limits) {
  const double tol = exact_f32_tolerance(10).rel_fro_error;
  RandomProblem prob(config(2, 1, 80, 120, 16, 2));
  EXPECT_LT(run_error("sparse.scatterbrain(buckets=1,chunk=120)", prob), tol);
  EXPECT_LT(run_error("sparse.scatterbrain(buckets=8,chunk=200,features=16)", prob), tol);
  // features = 0: the sparse part alone, i.e. sparse.reformer's softmax over the same union.
  const AttentionProblem& p = prob.problem();
  create_method("sparse.scatterbrain(features=0,rounds=3,chunk=8,seed=9)")->run(p, ExecContext{2});
  const std::vector<float> sb = prob.out_data();
  create_method("sparse.reformer(rounds=3,chunk=8,seed=9)")->run(p, ExecContext{2});
  for (std::size_t u = 0; u < sb.size(); ++u) ASSERT_NEAR(sb[u], prob.out_data()[u], 2e-5 * (1 + std::abs(sb[u])));
}

TEST(SparseScatterbrain, ErrorFallsWithChunkAndFeatures) {
  std::vector<double> by_chunk, by_feat;
  RandomProblem prob(config(2, 2, 256, 256, 32, 3));
  const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
  for (int chunk : {8, 32, 128}) {
    std::vector<double> e;
    for (int seed = 1; seed <= 5; ++seed)
      e.push_back(run_error(fmt::format("sparse.scatterbrain(chunk={},seed={})", chunk, seed), prob, ref));
    by_chunk.push_back(median(e));
  }
  ProblemConfig cfg = config(2, 2, 256, 256, 32, 4);
  cfg.logit_scale = 0.5;
  RandomProblem flat(cfg);
  const ReferenceRows fref = reference_all(flat.problem(), ExecContext{2});
  for (int feats : {8, 64, 512}) {
    std::vector<double> e;
    for (int seed = 1; seed <= 5; ++seed)
      e.push_back(run_error(fmt::format("sparse.scatterbrain(features={},chunk=16,seed={})", feats, seed), flat, fref));
    by_feat.push_back(median(e));
  }
  std::printf("scatterbrain (N=256) chunk 8/32/128: %.3g %.3g %.3g; features 8/64/512 (logits x0.5): %.3g %.3g %.3g\n",
              by_chunk[0], by_chunk[1], by_chunk[2], by_feat[0], by_feat[1], by_feat[2]);
  EXPECT_LT(by_chunk[1], by_chunk[0]);
  EXPECT_LT(by_chunk[2], by_chunk[1]);
  EXPECT_LT(by_feat[1], by_feat[0]);
  EXPECT_LT(by_feat[2], by_feat[1]);
}

TEST(SparseScatterbrain, HugeLogitsStayFinite) {
  ProblemConfig cfg = config(2, 2, 200, 200, 32, 5);
  cfg.logit_scale = 100;
  RandomProblem prob(cfg);
  const double e = run_error("sparse.scatterbrain(rounds=2,chunk=16)", prob);
  EXPECT_TRUE(std::isfinite(e));
  EXPECT_LT(e, 1.5);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
