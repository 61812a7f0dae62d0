// sparse.routing against a float64 transcription of the Routing Transformer's masked softmax
// (Roy et al., TACL 2021): with the method's own routing, each query's output is softmax over
// the union of the keys of its clusters (−∞ elsewhere, each key once) and its LSE is that
// union's; the routing is balanced (w_k keys, ≥ w_q queries per cluster, every query routed);
// clusters = 1 is exact; the error falls as clusters shrink; the keys attended hold most of each
// row's true top-k; causal problems are refused with the reason.
#include <gtest/gtest.h>

#include <set>

#include "attention/sparse/routing.h"
#include "attention/sparse_cluster_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using namespace cluster_test;

const RoutingAttention& as_routing(const AttentionMethod& m) { return dynamic_cast<const RoutingAttention&>(m); }

/// The keys query (b, h, i) attends to under routing `r`: the union of its clusters' keys.
std::set<index_t> union_keys(const RoutingAttention::Routing& r, index_t i) {
  std::set<index_t> u;
  for (index_t c = 0; c < r.clusters; ++c) {
    const auto& qs = r.queries[static_cast<std::size_t>(c)];
    if (std::binary_search(qs.begin(), qs.end(), i)) u.insert(r.keys[static_cast<std::size_t>(c)].begin(), r.keys[static_cast<std::size_t>(c)].end());
  }
  return u;
}

TEST(Routing, EqualsSoftmaxOverTheUnionOfItsClusters) {
  ProblemConfig cfg = config(4, 2, 45, 80, 16, test::base_seed() + 1);
  cfg.want_lse = true;
  RandomProblem prob(cfg);
  const AttentionProblem& p = prob.problem();
  auto m = create_method("sparse.routing(clusters=6,iters=3,seed=4)");
  m->run(p, ExecContext{3});
  std::vector<double> ref;
  double lse_err = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h) {
      const RoutingAttention::Routing r = as_routing(*m).routing(p, b, h);
      ASSERT_EQ(r.clusters, 6);
      std::vector<int> routed(static_cast<std::size_t>(p.n_q()), 0);
      for (index_t c = 0; c < r.clusters; ++c) {
        EXPECT_EQ(r.keys[static_cast<std::size_t>(c)].size(), 14u);  // ceil(80/6)
        EXPECT_GE(r.queries[static_cast<std::size_t>(c)].size(), 8u);  // ceil(45/6)
        for (index_t i : r.queries[static_cast<std::size_t>(c)]) routed[static_cast<std::size_t>(i)] = 1;
      }
      for (int x : routed) EXPECT_EQ(x, 1);
      for (index_t i = 0; i < p.n_q(); ++i) {
        const std::set<index_t> u = union_keys(r, i);
        double mx = -INFINITY, z = 0;
        for (index_t j : u) mx = std::max(mx, logit(p, b, h, i, j));
        std::vector<double> o(static_cast<std::size_t>(p.d_v()), 0.0);
        for (index_t j : u) {
          const double w = std::exp(logit(p, b, h, i, j) - mx);
          z += w;
          for (index_t c = 0; c < p.d_v(); ++c) o[static_cast<std::size_t>(c)] += w * p.v(b, h / p.group(), j, c);
        }
        for (double& x : o) ref.push_back(x / z);
        lse_err = std::max(lse_err, std::abs(p.lse(b, h, i, 0) - (mx + std::log(z))));
      }
    }
  EXPECT_LT(rel_error(p, ref), 1e-5);
  EXPECT_LT(lse_err, 1e-4);
}

TEST(Routing, OneClusterIsExact) {
  RandomProblem prob(config(3, 1, 37, 64, 32, test::base_seed() + 2));
  create_method("sparse.routing(clusters=1)")->run(prob.problem(), ExecContext{2});
  const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
  EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error);
  EXPECT_LE(e.max_scaled_error, exact_f32_tolerance(e.logit_magnitude).max_scaled_error);
}

TEST(Routing, ErrorFallsAsClustersShrink) {
  std::vector<double> med;
  for (int c : {32, 8, 2}) {
    std::vector<double> e;
    for (std::uint64_t s = 0; s < 5; ++s) {
      RandomProblem prob(config(2, 2, 256, 256, 32, test::base_seed() + 10 + s, Dist::kSpiky));
      e.push_back(error_of(fmt::format("sparse.routing(clusters={},seed={})", c, s), prob));
    }
    med.push_back(median(e));
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "step " << i;
}

TEST(Routing, AttendedKeysHoldMostOfTheTrueTopK) {
  // Each query attends to about 1/C of the keys; routing by cosine should find far more of its
  // top-8 than that (measured at C = 8, N = 512, D = 32 Gaussian: ≈ 0.4 against 0.13 by chance).
  RandomProblem prob(config(2, 2, 512, 512, 32, test::base_seed() + 20));
  const AttentionProblem& p = prob.problem();
  auto m = create_method("sparse.routing(clusters=8)");
  std::vector<std::vector<std::set<index_t>>> u(2);
  for (index_t h = 0; h < 2; ++h) {
    const RoutingAttention::Routing r = as_routing(*m).routing(p, 0, h);
    for (index_t i = 0; i < p.n_q(); ++i) u[static_cast<std::size_t>(h)].push_back(union_keys(r, i));
  }
  const double recall = topk_recall(p, 8, [&](index_t, index_t h, index_t i, index_t j) {
    return u[static_cast<std::size_t>(h)][static_cast<std::size_t>(i)].count(j) > 0;
  });
  std::printf("routing top-8 recall (C = 8, N = 512, Gaussian): %.3f\n", recall);
  EXPECT_GT(recall, 0.25);
}

// Its kernel is non-causal (training-free centroids): causal problems go to the causal recursion
// (method.h).
TEST(Routing, RunsCausalProblemsByTheRecursion) {
  ProblemConfig cfg = config(2, 2, 16, 16, 8, test::base_seed() + 30);
  cfg.causal = Causal::kBottomRight;
  RandomProblem prob(cfg);
  const auto m = create_method("sparse.routing");
  EXPECT_TRUE(m->runs_by_recursion(prob.problem()));
  EXPECT_TRUE(m->can_run(prob.problem()).is_ok());
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
