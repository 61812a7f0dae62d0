// sparse.multipole against a float64 transcription of Multipole Attention (Hooper et
// al., NeurIPS 2025): with the method's own key clusters, the `near` clusters of largest
// s·q·Kc + log N attended key by key and the others by N·exp(s·q·Kc)·Vc, output and LSE; limits
// (near ≥ C, and C = Nk with near = 1) exact; the error falls as near grows; the near clusters
// hold most of each row's true top-k.
#include <gtest/gtest.h>

#include <cmath>

#include "attention/sparse/multipole.h"
#include "attention/sparse_cluster_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using namespace cluster_test;

const MultipoleAttention& as_multipole(const AttentionMethod& m) { return dynamic_cast<const MultipoleAttention&>(m); }

/// Per kv head: sizes, key and value means (float64) of the method's clusters.
struct Moments {
  std::vector<double> n, kc, vc;
};
Moments moments(const AttentionProblem& p, const MultipoleAttention::KeyClusters& kc, index_t b, index_t hk) {
  const index_t C = kc.clusters, dk = p.d_qk(), dv = p.d_v();
  Moments m{std::vector<double>(static_cast<std::size_t>(C), 0.0), std::vector<double>(static_cast<std::size_t>(C * dk), 0.0),
            std::vector<double>(static_cast<std::size_t>(C * dv), 0.0)};
  for (index_t j = 0; j < p.n_kv(); ++j) {
    const index_t c = kc.assign[static_cast<std::size_t>(j)];
    m.n[static_cast<std::size_t>(c)] += 1;
    for (index_t e = 0; e < dk; ++e) m.kc[static_cast<std::size_t>(c * dk + e)] += p.k(b, hk, j, e);
    for (index_t e = 0; e < dv; ++e) m.vc[static_cast<std::size_t>(c * dv + e)] += p.v(b, hk, j, e);
  }
  for (index_t c = 0; c < C; ++c) {
    const double n = std::max(m.n[static_cast<std::size_t>(c)], 1.0);
    for (index_t e = 0; e < dk; ++e) m.kc[static_cast<std::size_t>(c * dk + e)] /= n;
    for (index_t e = 0; e < dv; ++e) m.vc[static_cast<std::size_t>(c * dv + e)] /= n;
  }
  return m;
}

/// The near clusters of query (b, h, i): the `near` largest importances (ties: lower index).
std::vector<index_t> near_clusters(const AttentionProblem& p, const Moments& m, index_t b, index_t h, index_t i, index_t near) {
  const index_t C = static_cast<index_t>(m.n.size()), dk = p.d_qk();
  std::vector<double> u(static_cast<std::size_t>(C));
  std::vector<index_t> idx;
  for (index_t c = 0; c < C; ++c) {
    double t = 0;
    for (index_t e = 0; e < dk; ++e) t += static_cast<double>(p.q(b, h, i, e)) * m.kc[static_cast<std::size_t>(c * dk + e)];
    u[static_cast<std::size_t>(c)] = p.effective_scale() * t + std::log(m.n[static_cast<std::size_t>(c)]);
    if (m.n[static_cast<std::size_t>(c)] > 0) idx.push_back(c);
  }
  std::stable_sort(idx.begin(), idx.end(), [&](index_t a, index_t c) { return u[static_cast<std::size_t>(a)] > u[static_cast<std::size_t>(c)]; });
  idx.resize(std::min<std::size_t>(idx.size(), static_cast<std::size_t>(near)));
  return idx;
}

TEST(Multipole, EqualsItsFloat64Transcription) {
  ProblemConfig cfg = config(4, 2, 50, 120, 16, test::base_seed() + 1);
  cfg.want_lse = true;
  RandomProblem prob(cfg);
  const AttentionProblem& p = prob.problem();
  const index_t near = 3, dk = p.d_qk(), dv = p.d_v();
  auto m = create_method("sparse.multipole(clusters=10,near=3,iters=5,seed=3)");
  m->run(p, ExecContext{3});
  std::vector<double> ref;
  double lse_err = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h) {
      const index_t hk = h / p.group();
      const MultipoleAttention::KeyClusters kc = as_multipole(*m).key_clusters(p, b, hk);
      ASSERT_EQ(kc.clusters, 10);
      const Moments mo = moments(p, kc, b, hk);
      for (index_t i = 0; i < p.n_q(); ++i) {
        const std::vector<index_t> nc = near_clusters(p, mo, b, h, i, near);
        std::vector<double> l, w;  // logits of exact keys and of far pseudo-keys, with their values
        std::vector<const double*> vf;
        std::vector<index_t> vk;
        for (index_t j = 0; j < p.n_kv(); ++j)
          if (std::find(nc.begin(), nc.end(), kc.assign[static_cast<std::size_t>(j)]) != nc.end()) {
            l.push_back(logit(p, b, h, i, j));
            vk.push_back(j);
          }
        const std::size_t exact = l.size();
        for (index_t c = 0; c < kc.clusters; ++c) {
          if (mo.n[static_cast<std::size_t>(c)] == 0 || std::find(nc.begin(), nc.end(), c) != nc.end()) continue;
          double t = 0;
          for (index_t e = 0; e < dk; ++e) t += static_cast<double>(p.q(b, h, i, e)) * mo.kc[static_cast<std::size_t>(c * dk + e)];
          l.push_back(p.effective_scale() * t + std::log(mo.n[static_cast<std::size_t>(c)]));
          vf.push_back(mo.vc.data() + c * dv);
        }
        const double mx = *std::max_element(l.begin(), l.end());
        double z = 0;
        std::vector<double> o(static_cast<std::size_t>(dv), 0.0);
        for (std::size_t t = 0; t < l.size(); ++t) {
          const double e = std::exp(l[t] - mx);
          z += e;
          for (index_t c = 0; c < dv; ++c)
            o[static_cast<std::size_t>(c)] += e * (t < exact ? p.v(b, hk, vk[t], c) : vf[t - exact][c]);
        }
        for (double& x : o) ref.push_back(x / z);
        lse_err = std::max(lse_err, std::abs(p.lse(b, h, i, 0) - (mx + std::log(z))));
      }
    }
  EXPECT_LT(rel_error(p, ref), 1e-5);
  EXPECT_LT(lse_err, 1e-4);
}

TEST(Multipole, AllNearOrOneKeyPerClusterIsExact) {
  ProblemConfig cfg = config(3, 1, 37, 64, 32, test::base_seed() + 2);
  cfg.want_lse = true;
  RandomProblem prob(cfg);
  for (const char* spec : {"sparse.multipole(clusters=8,near=8)", "sparse.multipole(clusters=64,near=1)"}) {
    create_method(spec)->run(prob.problem(), ExecContext{2});
    const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
    EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error) << spec;
    EXPECT_LE(e.max_scaled_error, exact_f32_tolerance(e.logit_magnitude).max_scaled_error) << spec;
    EXPECT_LE(e.lse_max_abs_error, exact_f32_tolerance(e.logit_magnitude).lse_max_abs_error) << spec;
  }
}

TEST(Multipole, ErrorFallsAsNearGrows) {
  std::vector<double> med;
  for (int n : {1, 4, 12}) {
    std::vector<double> e;
    for (std::uint64_t s = 0; s < 5; ++s) {
      RandomProblem prob(config(2, 2, 256, 256, 32, test::base_seed() + 10 + s, Dist::kSpiky));
      e.push_back(error_of(fmt::format("sparse.multipole(clusters=16,near={},seed={})", n, s), prob));
    }
    med.push_back(median(e));
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "step " << i;
}

TEST(Multipole, NearClustersHoldMostOfTheTrueTopK) {
  RandomProblem prob(config(2, 2, 512, 512, 32, test::base_seed() + 20));
  const AttentionProblem& p = prob.problem();
  auto m = create_method("sparse.multipole(clusters=32,near=4)");
  std::vector<MultipoleAttention::KeyClusters> kc;
  std::vector<Moments> mo;
  for (index_t h = 0; h < 2; ++h) {
    kc.push_back(as_multipole(*m).key_clusters(p, 0, h));
    mo.push_back(moments(p, kc.back(), 0, h));
  }
  index_t last_h = -1, last_i = -1;
  std::vector<index_t> nc;
  const double recall = topk_recall(p, 8, [&](index_t, index_t h, index_t i, index_t j) {
    if (h != last_h || i != last_i) {
      nc = near_clusters(p, mo[static_cast<std::size_t>(h)], 0, h, i, 4);
      last_h = h;
      last_i = i;
    }
    return std::find(nc.begin(), nc.end(), kc[static_cast<std::size_t>(h)].assign[static_cast<std::size_t>(j)]) != nc.end();
  });
  // 4 of 32 clusters hold 1/8 of the keys: 0.125 of the top-8 by chance.
  std::printf("multipole top-8 recall (C = 32, near = 4, N = 512, Gaussian): %.3f\n", recall);
  EXPECT_GT(recall, 0.3);
}

TEST(Multipole, CausalRowsNeverReadFutureKeys) {
  // Poison every key after row i's diagonal (k ×1e3, v = 1e30): row i must come out the same,
  // for both alignments (the clusters it uses are fitted on its past only). Same up to float32
  // rounding, not bitwise: BLAS kernels differ between CPUs (OpenBLAS picks them at run time)
  // and some round a row differently when the other rows of the panel change. A read of a
  // poisoned key moves the row by ~1e30 · its weight or its LSE by ~1e3 · |q·k|, far past 1e-5.
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
    ProblemConfig cfg = config(2, 1, c == Causal::kTopLeft ? 300 : 90, 300, 16, test::base_seed() + 30);
    cfg.causal = c;
    cfg.want_lse = true;
    RandomProblem clean(cfg);
    const AttentionProblem& p = clean.problem();
    auto m = create_method("sparse.multipole(clusters=16,near=2)");
    m->run(p, ExecContext{2});
    for (index_t i : {index_t{3}, index_t{70}, p.n_q() - 40}) {
      RandomProblem dirty(cfg);
      const AttentionProblem& d = dirty.problem();
      for (index_t j = i + p.diag_offset() + 1; j < p.n_kv(); ++j)
        for (index_t e = 0; e < p.d_qk(); ++e) {
          dirty.k_data()[static_cast<std::size_t>(d.k.row(0, 0, j) + e - dirty.k_data().data())] *= 1e3f;
          if (e < p.d_v()) dirty.v_data()[static_cast<std::size_t>(d.v.row(0, 0, j) + e - dirty.v_data().data())] = 1e30f;
        }
      m->run(d, ExecContext{2});
      for (index_t h = 0; h < 2; ++h) {
        for (index_t e = 0; e < p.d_v(); ++e)
          ASSERT_NEAR(d.out(0, h, i, e), p.out(0, h, i, e), 1e-5 * (1 + std::abs(p.out(0, h, i, e))))
              << to_string(c) << " row " << i;
        ASSERT_NEAR(d.lse(0, h, i, 0), p.lse(0, h, i, 0), 1e-5 * (1 + std::abs(p.lse(0, h, i, 0))));
      }
    }
    // And the causal output is an approximation of causal attention that is exact with all near.
    create_method("sparse.multipole(clusters=16,near=65536)")->run(p, ExecContext{2});
    const ErrorMetrics e = compare_with_reference(p, reference_all(p, ExecContext{2}));
    EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error) << to_string(c);
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
