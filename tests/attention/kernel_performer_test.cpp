// kernel.performer: against a dense float64 transcription of FAVOR+ (same draws), causal variants
// against the dense masked computation, the PRF statistics (unbiased, positive), and error vs
// features.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <cmath>
#include <vector>

#include "attention/kernel/performer.h"
#include "attention/kernel_dense.h"
#include "numattn/attention/registry.h"
#include "numattn/core/rng.h"
#include "numattn/decomp/random_features.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::base_seed;

ProblemConfig config(index_t hq, index_t hk, index_t n, index_t nk, index_t d, index_t dv, Causal c,
                     std::uint64_t seed) {
  return test::method_problem(hq, hk, n, nk, d, dv, c, seed);
}

/// FAVOR+ in float64 with the method's draws and its stabiliser (rows of Φ_Q over their maximum,
/// Φ_K over the maximum of the keys every row sees, + ε; trig: key weights over one factor,
/// clamped denominator).
std::vector<double> dense_performer(const PerformerAttention& m, const AttentionProblem& p) {
  const auto ker = m.kernel();
  const index_t M = m.params().get_int("features"), d = p.d_qk();
  const index_t f = ker == PerformerAttention::Kernel::kPositive ? M : 2 * M;
  const double rs = std::sqrt(p.effective_scale());
  std::vector<std::vector<double>> w;
  for (index_t hk = 0; hk < p.kv_heads(); ++hk) w.push_back(m.directions(d, hk));
  auto phi = [&](index_t h_kv) {
    return [&, h_kv](index_t, const double* x, double* out) {
      PerformerAttention::features_f64(ker, w[static_cast<std::size_t>(h_kv)], M, x, d, out);
    };
  };
  // Features per head (the query head's kv head picks the draw).
  std::vector<std::vector<double>> fq, fk;
  for (index_t b = 0; b < p.batch(); ++b) {
    (void)b;
  }
  const index_t nq = p.n_q(), nk = p.n_kv();
  std::vector<double> Fq(static_cast<std::size_t>(p.batch() * p.heads() * nq * f));
  std::vector<double> Fk(static_cast<std::size_t>(p.batch() * p.kv_heads() * nk * f));
  std::vector<double> x(static_cast<std::size_t>(d));
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < nq; ++i) {
        for (index_t k = 0; k < d; ++k) x[static_cast<std::size_t>(k)] = rs * p.q(b, h, i, k);
        double* o = Fq.data() + ((b * p.heads() + h) * nq + i) * f;
        phi(h / p.group())(0, x.data(), o);
        if (ker == PerformerAttention::Kernel::kTrig) {  // a per-row factor: cancels, drop it
          double n2 = 0;
          for (double v : x) n2 += v * v;
          for (index_t c = 0; c < f; ++c) o[c] *= std::exp(-n2 / 2);
          continue;
        }
        const double mx = *std::max_element(o, o + f);
        for (index_t c = 0; c < f; ++c) o[c] = o[c] / mx + 1e-6;
      }
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t hk = 0; hk < p.kv_heads(); ++hk) {
      double* base = Fk.data() + (b * p.kv_heads() + hk) * nk * f;
      const index_t nread = test::dense_seen(p, nq - 1);
      for (index_t j = 0; j < nread; ++j) {
        for (index_t k = 0; k < d; ++k) x[static_cast<std::size_t>(k)] = rs * p.k(b, hk, j, k);
        phi(hk)(0, x.data(), base + j * f);
      }
      if (ker == PerformerAttention::Kernel::kTrig) {  // one factor per head: cancels (no ε)
        const double mx = *std::max_element(base, base + nread * f, [](double a, double c) { return std::abs(a) < std::abs(c); });
        for (index_t e = 0; e < nread * f; ++e) base[e] /= std::abs(mx);
        continue;
      }
      // Over the largest feature of the keys every row that sees a key sees, then + ε.
      index_t common = nread;
      for (index_t i = 0; i < nq; ++i)
        if (test::dense_seen(p, i) > 0) common = std::min(common, test::dense_seen(p, i));
      const double mx = *std::max_element(base, base + common * f);
      for (index_t e = 0; e < nread * f; ++e) base[e] = base[e] / mx + 1e-6;
    }
  auto kappa = [&](index_t b, index_t h, index_t i, index_t j) {
    const double* a = Fq.data() + ((b * p.heads() + h) * nq + i) * f;
    const double* c = Fk.data() + ((b * p.kv_heads() + h / p.group()) * nk + j) * f;
    double s = 0;
    for (index_t e = 0; e < f; ++e) s += a[e] * c[e];
    return s;
  };
  return test::dense_kernel_attention(p, kappa, 0, ker == PerformerAttention::Kernel::kTrig);
}

struct Shape {
  index_t hq, hk, n, nk, d, dv;
  Causal c;
};

TEST(KernelPerformer, MatchesDenseTranscription) {
  const Shape shapes[] = {{2, 1, 37, 37, 16, 16, Causal::kNone},     {4, 2, 45, 70, 8, 5, Causal::kBottomRight},
                          {2, 2, 300, 300, 16, 16, Causal::kTopLeft}, {2, 1, 70, 33, 16, 8, Causal::kTopLeft},
                          {2, 2, 50, 30, 8, 8, Causal::kBottomRight}};
  const char* specs[] = {"kernel.performer(features=64,seed=3)",
                         "kernel.performer(features=40,orthogonal=false,seed=4)",
                         "kernel.performer(features=48,kernel=hyperbolic,seed=5)",
                         "kernel.performer(features=64,kernel=trig,seed=6)",
                         "kernel.performer(features=64,causal_algo=prefix,seed=7)",
                         "kernel.performer(features=32,redraw=shared,seed=8)"};
  std::uint64_t seed = base_seed();
  for (const Shape& s : shapes)
    for (const char* spec : specs) {
      RandomProblem prob(config(s.hq, s.hk, s.n, s.nk, s.d, s.dv, s.c, ++seed));
      auto m = create_method(spec);
      const auto& pm = dynamic_cast<const PerformerAttention&>(*m);
      for (int t : {1, 3}) {
        m->run(prob.problem(), ExecContext{t});
        const double e = test::rel_error_vs(dense_performer(pm, prob.problem()), prob.problem());
        EXPECT_LT(e, 2e-4) << spec << " causal=" << to_string(s.c) << " n=" << s.n << " nk=" << s.nk << " t=" << t;
      }
    }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

/// Mean over draws of φ(q)·φ(k) for the float64 features of each kernel, against exp(q·k).
TEST(KernelPerformer, FeatureEstimatesAreUnbiased) {
  const index_t d = 8, M = 64;
  std::vector<double> q(d), k(d);
  fill_normal(std::span<double>(q), base_seed(), 1);
  fill_normal(std::span<double>(k), base_seed(), 2);
  for (index_t i = 0; i < d; ++i) {
    q[static_cast<std::size_t>(i)] *= 0.35;
    k[static_cast<std::size_t>(i)] *= 0.35;
  }
  double qk = 0;
  for (index_t i = 0; i < d; ++i) qk += q[static_cast<std::size_t>(i)] * k[static_cast<std::size_t>(i)];
  const double truth = std::exp(qk);
  for (auto ker : {PerformerAttention::Kernel::kPositive, PerformerAttention::Kernel::kHyperbolic,
                   PerformerAttention::Kernel::kTrig}) {
    const index_t f = ker == PerformerAttention::Kernel::kPositive ? M : 2 * M;
    const int draws = 400;
    double sum = 0, sum2 = 0;
    bool positive = true;
    for (int s = 0; s < draws; ++s) {
      const std::vector<double> w = decomp::orthogonal_features(M, d, base_seed() + static_cast<std::uint64_t>(s), 0);
      std::vector<double> a(static_cast<std::size_t>(f)), b(static_cast<std::size_t>(f));
      PerformerAttention::features_f64(ker, w, M, q.data(), d, a.data());
      PerformerAttention::features_f64(ker, w, M, k.data(), d, b.data());
      double e = 0;
      for (index_t c = 0; c < f; ++c) {
        e += a[static_cast<std::size_t>(c)] * b[static_cast<std::size_t>(c)];
        positive &= a[static_cast<std::size_t>(c)] > 0 && b[static_cast<std::size_t>(c)] > 0;
      }
      sum += e;
      sum2 += e * e;
    }
    const double mean = sum / draws, sd = std::sqrt(std::max(0.0, sum2 / draws - mean * mean));
    EXPECT_NEAR(mean, truth, 4 * sd / std::sqrt(draws) + 1e-12) << static_cast<int>(ker) << " sd " << sd;
    if (ker != PerformerAttention::Kernel::kTrig) EXPECT_TRUE(positive);
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

/// rel_fro_error of `spec` against softmax on a problem where the PRF variance is moderate
/// (scale 0.05, D = 16: ‖√s·q‖² ≈ ‖√s·k‖² ≈ 0.8; with unit-variance entries and the default scale
/// ‖√s·x‖² ≈ √D and the variance e^{2‖x‖²}/M is too heavy-tailed for a clean 1/√M), median over
/// `seeds` method seeds; `all` receives every value.
double median_error(const std::string& spec, int seeds, std::vector<double>* all = nullptr, Causal c = Causal::kNone) {
  ProblemConfig cfg;
  cfg.heads = 2;
  cfg.n = 128;
  cfg.d = 16;
  cfg.scale = 0.05;
  cfg.causal = c;
  cfg.seed = base_seed() + 77;
  cfg.want_lse = false;
  RandomProblem prob(cfg);
  const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
  std::vector<double> e;
  for (int s = 1; s <= seeds; ++s) {
    auto m = create_method(spec.substr(0, spec.size() - 1) + ",seed=" + std::to_string(s) + ")");
    m->run(prob.problem(), ExecContext{2});
    e.push_back(compare_with_reference(prob.problem(), ref).rel_fro_error);
  }
  if (all) *all = e;
  std::sort(e.begin(), e.end());
  return e[e.size() / 2];
}

TEST(KernelPerformer, ErrorFallsAsFeaturesGrow) {
  std::vector<double> med;
  for (int f : {16, 64, 256, 1024}) {
    med.push_back(median_error("kernel.performer(features=" + std::to_string(f) + ")", 7));
    std::printf("performer features=%d median rel_fro_error %.4f\n", f, med.back());
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]);
  EXPECT_LT(med.back(), 0.35 * med.front());  // ~1/√M: 1/8 in theory
  // Causal variants converge the same way.
  EXPECT_LT(median_error("kernel.performer(features=1024)", 5, nullptr, Causal::kTopLeft),
            0.5 * median_error("kernel.performer(features=16)", 5, nullptr, Causal::kTopLeft));
}

TEST(KernelPerformer, OrthogonalFeaturesBeatIidOnAverage) {
  // Choromanski et al. 2021 / issue acceptance: over ≥ 20 seeds at equal M, mean error ORF < i.i.d.
  for (int f : {16, 64}) {
    std::vector<double> orf, iid;
    median_error("kernel.performer(features=" + std::to_string(f) + ")", 24, &orf);
    median_error("kernel.performer(features=" + std::to_string(f) + ",orthogonal=false)", 24, &iid);
    double mo = 0, mi = 0;
    for (double x : orf) mo += x / static_cast<double>(orf.size());
    for (double x : iid) mi += x / static_cast<double>(iid.size());
    std::printf("performer features=%d over 24 seeds: mean rel_fro_error orthogonal %.4f, iid %.4f\n", f, mo, mi);
    EXPECT_LT(mo, mi) << f;
  }
}

TEST(KernelPerformer, InfiniteFeaturesIsSoftmax) {
  EXPECT_LT(median_error("kernel.performer(features=0)", 1), 1e-5);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
