// The float64 reference computes every target of target.h; checked here against a dense
// transcription of each formula (all pairs, no max shift, no streaming), written apart from
// reference.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "numattn/attention/random_problem.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/target.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using Kernel = std::function<double(const std::vector<double>& q, const std::vector<double>& k)>;

/// out_i = Σ_j w_ij v_j / (c + Σ_j w_ij) over visible j (or the bare sum), w = κ·exp(mask).
std::vector<double> dense(const AttentionProblem& p, const Kernel& kappa, double c, bool normalised) {
  std::vector<double> out;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i) {
        const index_t hk = h / p.group();
        std::vector<double> q(p.q.row(b, h, i), p.q.row(b, h, i) + p.d_qk());
        std::vector<double> num(static_cast<std::size_t>(p.d_v()), 0.0);
        double den = c;
        for (index_t j = 0; j < p.n_kv(); ++j) {
          if (!p.visible(i, j)) continue;
          double add = 0;
          if (p.mask.kind == MaskKind::kAdditive) add = p.mask.additive[i * p.mask.ld + j];
          std::vector<double> k(p.k.row(b, hk, j), p.k.row(b, hk, j) + p.d_qk());
          const double w = kappa(q, k) * std::exp(add);
          den += w;
          for (index_t d = 0; d < p.d_v(); ++d) num[static_cast<std::size_t>(d)] += w * p.v(b, hk, j, d);
        }
        for (double x : num) out.push_back(normalised ? (den == 0 ? 0.0 : x / den) : x);
      }
  return out;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t d = 0; d < a.size(); ++d) s += a[d] * b[d];
  return s;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t t = 0; t < got.size(); ++t)
    ASSERT_NEAR(got[t], want[t], tol * (1 + std::abs(want[t]))) << what << " at " << t;
}

struct Case {
  Causal causal;
  index_t heads, kv_heads, n, n_kv;
  bool additive;
};

class TargetRef : public ::testing::TestWithParam<Case> {
 protected:
  std::unique_ptr<RandomProblem> make() {
    const Case c = GetParam();
    ProblemConfig cfg;
    cfg.heads = c.heads, cfg.kv_heads = c.kv_heads, cfg.n = c.n, cfg.n_kv = c.n_kv, cfg.d = 5, cfg.dv = 3;
    cfg.causal = c.causal;
    cfg.seed = 11;
    auto prob = std::make_unique<RandomProblem>(cfg);
    if (c.additive) {
      std::vector<float> add(static_cast<std::size_t>(c.n * c.n_kv));
      for (std::size_t t = 0; t < add.size(); ++t)
        add[t] = t % 5 == 0 ? -INFINITY : 0.25f * static_cast<float>(t % 3);
      prob->set_additive_mask(add);
    }
    return prob;
  }
};

TEST_P(TargetRef, SoftmaxIsTheDefault) {
  auto prob = make();
  const auto& p = prob->problem();
  const ReferenceRows a = reference_all(p, ExecContext{1});
  const ReferenceRows b = reference_all(p, ExecContext{2}, Target::softmax());
  EXPECT_EQ(a.out, b.out);
  const double s = p.effective_scale();
  expect_close(a.out, dense(p, [&](auto& q, auto& k) { return std::exp(s * dot(q, k)); }, 0, true),
               1e-12, "softmax");
}

TEST_P(TargetRef, GaussianKernel) {
  auto prob = make();
  const auto& p = prob->problem();
  const double s = p.effective_scale();
  const Kernel g = [&](auto& q, auto& k) {
    double d2 = 0;
    for (std::size_t d = 0; d < q.size(); ++d) d2 += (q[d] - k[d]) * (q[d] - k[d]);
    return std::exp(-s * d2 / 2);
  };
  expect_close(reference_all(p, ExecContext{2}, Target::gaussian()).out, dense(p, g, 0, true), 1e-12,
               "gaussian");
  Target raw = Target::gaussian();
  raw.normalised = false;
  expect_close(reference_all(p, ExecContext{2}, raw).out, dense(p, g, 0, false), 1e-12,
               "gaussian, unnormalised");
}

TEST_P(TargetRef, PolynomialKernel) {
  auto prob = make();
  const auto& p = prob->problem();
  const double s = p.effective_scale();
  for (int deg : {0, 1, 2, 4})
    for (double c : {0.0, 1.0}) {
      const Kernel k = [&](auto& q, auto& kk) { return std::pow(s * dot(q, kk), deg); };
      const ReferenceRows r = reference_all(p, ExecContext{2}, Target::polynomial(deg, c));
      // Odd degrees can cancel a denominator to nearly 0: compare absolutely, scaled.
      if (deg % 2 == 1) continue;
      expect_close(r.out, dense(p, k, c, true), 1e-11, "polynomial");
    }
}

TEST_P(TargetRef, FeatureMap) {
  auto prob = make();
  const auto& p = prob->problem();
  const auto elu1 = [](const double* x, index_t d, double, double* phi) {
    for (index_t t = 0; t < d; ++t) phi[t] = x[t] > 0 ? x[t] + 1 : std::exp(x[t]);
  };
  const Target t = Target::feature("elu+1", elu1, [](index_t d) { return d; });
  const Kernel k = [&](auto& q, auto& kk) {
    double s = 0;
    for (std::size_t d = 0; d < q.size(); ++d)
      s += (q[d] > 0 ? q[d] + 1 : std::exp(q[d])) * (kk[d] > 0 ? kk[d] + 1 : std::exp(kk[d]));
    return s;
  };
  expect_close(reference_all(p, ExecContext{2}, t).out, dense(p, k, 0, true), 1e-12, "elu+1");
  EXPECT_EQ(t.name(), "feature-map(elu+1)");
}

INSTANTIATE_TEST_SUITE_P(Shapes, TargetRef,
                         ::testing::Values(Case{Causal::kNone, 2, 2, 7, 7, false},
                                           Case{Causal::kBottomRight, 4, 2, 5, 9, false},
                                           Case{Causal::kTopLeft, 2, 1, 9, 6, true},
                                           Case{Causal::kNone, 3, 3, 1, 13, true}));

TEST(TargetRef, PolynomialDegreeZeroAveragesTheVisibleValues) {
  // Survey identity 13.2.11: p = 0 without the "+1" gives 1/N per visible key, with it 1/(N+1).
  ProblemConfig cfg;
  cfg.heads = 1, cfg.n = 6, cfg.d = 4, cfg.causal = Causal::kTopLeft, cfg.seed = 3;
  RandomProblem prob(cfg);
  const auto& p = prob.problem();
  for (double c : {0.0, 1.0}) {
    const ReferenceRows r = reference_all(p, ExecContext{1}, Target::polynomial(0, c));
    for (index_t i = 0; i < p.n_q(); ++i)
      for (index_t d = 0; d < p.d_v(); ++d) {
        double mean = 0;
        for (index_t j = 0; j <= i; ++j) mean += p.v(0, 0, j, d);
        EXPECT_NEAR(r.out[static_cast<std::size_t>(i * p.d_v() + d)], mean / (static_cast<double>(i + 1) + c), 1e-14);
      }
  }
}

TEST(TargetRef, NamesAreCanonical) {
  EXPECT_EQ(Target::softmax().name(), "softmax");
  EXPECT_EQ(Target::gaussian().name(), "gaussian");
  EXPECT_EQ(Target::polynomial(4, 1).name(), "polynomial(p=4,c=1)");
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
