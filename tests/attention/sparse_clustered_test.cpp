// sparse.clustered against a float64 transcription of improved clustered attention (Vyas et
// al. 2020): with the method's own clustering, out_i = m̂_c·softmax_{T_c}(q_i)·V + Σ_{j∉T_c}
// A_c(j)·v_j; the weights sum to 1 (constant values come out unchanged); topk ≥ Nk is exact; the
// error falls as topk grows; the top-k keys of the centroid hold most of each query's true top-k.
#include <gtest/gtest.h>

#include "attention/sparse/clustered.h"
#include "attention/sparse_cluster_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using namespace cluster_test;

const ClusteredAttention& as_clustered(const AttentionMethod& m) { return dynamic_cast<const ClusteredAttention&>(m); }

TEST(Clustered, EqualsItsFloat64Transcription) {
  RandomProblem prob(config(4, 2, 60, 90, 16, test::base_seed() + 1));
  const AttentionProblem& p = prob.problem();
  auto m = create_method("sparse.clustered(clusters=5,topk=12,iters=4,seed=2)");
  m->run(p, ExecContext{3});
  const index_t nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v();
  const double s = p.effective_scale();
  std::vector<double> ref;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h) {
      const index_t hk = h / p.group();
      const ClusteredAttention::Clustering cl = as_clustered(*m).clustering(p, b, h);
      ASSERT_EQ(cl.clusters, 5);
      for (index_t i = 0; i < p.n_q(); ++i) {
        const index_t c = cl.assign[static_cast<std::size_t>(i)];
        const auto& T = cl.topk[static_cast<std::size_t>(c)];
        ASSERT_EQ(T.size(), 12u);
        // The centroid's attention A_c over all keys.
        std::vector<double> a(static_cast<std::size_t>(nk));
        double mx = -INFINITY, z = 0;
        for (index_t j = 0; j < nk; ++j) {
          double t = 0;
          for (index_t e = 0; e < dk; ++e) t += static_cast<double>(cl.centroids[static_cast<std::size_t>(c * dk + e)]) * p.k(b, hk, j, e);
          a[static_cast<std::size_t>(j)] = s * t;
          mx = std::max(mx, s * t);
        }
        for (double& x : a) z += (x = std::exp(x - mx));
        for (double& x : a) x /= z;
        double mass = 0;
        for (index_t j : T) mass += a[static_cast<std::size_t>(j)];
        // The query's own softmax over T_c.
        double qm = -INFINITY, qz = 0;
        for (index_t j : T) qm = std::max(qm, logit(p, b, h, i, j));
        std::vector<double> o(static_cast<std::size_t>(dv), 0.0);
        for (index_t j : T) {
          const double w = std::exp(logit(p, b, h, i, j) - qm);
          qz += w;
          for (index_t e = 0; e < dv; ++e) o[static_cast<std::size_t>(e)] += w * p.v(b, hk, j, e);
        }
        for (double& x : o) x *= mass / qz;
        for (index_t j = 0; j < nk; ++j)
          if (!std::binary_search(T.begin(), T.end(), j))
            for (index_t e = 0; e < dv; ++e) o[static_cast<std::size_t>(e)] += a[static_cast<std::size_t>(j)] * p.v(b, hk, j, e);
        ref.insert(ref.end(), o.begin(), o.end());
      }
    }
  EXPECT_LT(rel_error(p, ref), 1e-5);
}

TEST(Clustered, WeightsSumToOne) {
  RandomProblem prob(config(2, 1, 40, 70, 8, test::base_seed() + 2));
  std::fill(prob.v_data().begin(), prob.v_data().end(), 3.f);
  create_method("sparse.clustered(clusters=4,topk=5)")->run(prob.problem(), ExecContext{2});
  for (float x : prob.out_data()) EXPECT_NEAR(x, 3.f, 1e-5f);
}

TEST(Clustered, TopkAtLeastNkIsExact) {
  RandomProblem prob(config(3, 1, 37, 64, 32, test::base_seed() + 3));
  create_method("sparse.clustered(clusters=3,topk=64)")->run(prob.problem(), ExecContext{2});
  const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
  EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error);
  EXPECT_LE(e.max_scaled_error, exact_f32_tolerance(e.logit_magnitude).max_scaled_error);
}

TEST(Clustered, ErrorFallsAsTopkGrows) {
  std::vector<double> med;
  for (int k : {4, 16, 64}) {
    std::vector<double> e;
    for (std::uint64_t s = 0; s < 5; ++s) {
      RandomProblem prob(config(2, 2, 256, 256, 32, test::base_seed() + 10 + s, Dist::kSpiky));
      e.push_back(error_of(fmt::format("sparse.clustered(clusters=16,topk={},seed={})", k, s), prob));
    }
    med.push_back(median(e));
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "step " << i;
}

TEST(Clustered, CentroidTopkHoldsMostOfEachQuerysTopK) {
  RandomProblem prob(config(2, 2, 512, 512, 32, test::base_seed() + 20));
  const AttentionProblem& p = prob.problem();
  auto m = create_method("sparse.clustered(clusters=32,topk=32)");
  std::vector<ClusteredAttention::Clustering> cl;
  for (index_t h = 0; h < 2; ++h) cl.push_back(as_clustered(*m).clustering(p, 0, h));
  const double recall = topk_recall(p, 8, [&](index_t, index_t h, index_t i, index_t j) {
    const auto& c = cl[static_cast<std::size_t>(h)];
    const auto& T = c.topk[static_cast<std::size_t>(c.assign[static_cast<std::size_t>(i)])];
    return std::binary_search(T.begin(), T.end(), j);
  });
  // 32 of 512 keys by chance hold 1/16 of the top-8.
  std::printf("clustered top-8 recall (C = 32, topk = 32, N = 512, Gaussian): %.3f\n", recall);
  EXPECT_GT(recall, 0.2);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
