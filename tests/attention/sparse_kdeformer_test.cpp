// sparse.kdeformer against a float64 transcription of KDEformer's practical algorithm (Zandieh et
// al., ICML 2023, and its official code) from the method's own hashes and draws: exact
// block-diagonal part plus the weighted residual of the drawn keys outside the query's block,
// output num/den, lse = log den; the same at logits far beyond exp's range (the shift carried
// through the ratio); the KDE lifting identity (with its e^{‖q‖²/2}) and the sampling distribution;
// the limit bucket ≥ Nk; error falling with the samples; numerator and denominator unbiased over
// seeds; top-k recall of the LSH blocks; causal refusal; thread independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "attention/sparse/kdeformer.h"
#include "numattn/attention/registry.h"
#include "numattn/core/rng.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d / 2, Causal::kNone, seed, Dist::kGaussian, true);
}

const KdeformerAttention& as_kde(const std::unique_ptr<AttentionMethod>& m) {
  return dynamic_cast<const KdeformerAttention&>(*m);
}

double logit(const AttentionProblem& p, index_t b, index_t h, index_t i, index_t j) {
  double s = 0;
  for (index_t c = 0; c < p.d_qk(); ++c) s += static_cast<double>(p.q(b, h, i, c)) * p.k(b, h / p.group(), j, c);
  return p.effective_scale() * s;
}

/// KDEformer in float64: out rows then lse per row, in (b, h, i) order.
void transcription(const KdeformerAttention& m, const AttentionProblem& p, std::vector<double>& out, std::vector<double>& lse) {
  const index_t nq = p.n_q(), nk = p.n_kv(), dv = p.d_v(), nb = m.blocks_for(p);
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h) {
      const KdeformerAttention::KeyPlan kp = m.key_plan(p, b, h / p.group());
      const std::vector<index_t> qo = m.query_order(p, b, h);
      std::vector<index_t> qblock(static_cast<std::size_t>(nq));
      for (index_t g = 0; g < nb; ++g)
        for (index_t s = g * nq / nb; s < (g + 1) * nq / nb; ++s) qblock[static_cast<std::size_t>(qo[static_cast<std::size_t>(s)])] = g;
      for (index_t i = 0; i < nq; ++i) {
        const index_t g = qblock[static_cast<std::size_t>(i)];
        // Terms (log weight, key): the block's keys with weight 1, the draws outside it.
        std::vector<std::pair<double, index_t>> terms;
        for (index_t j = 0; j < nk; ++j)
          if (kp.block[static_cast<std::size_t>(j)] == g) terms.push_back({logit(p, b, h, i, j), j});
        for (std::size_t t = 0; t < kp.sample.size(); ++t) {
          const index_t j = kp.sample[t];
          if (kp.block[static_cast<std::size_t>(j)] != g) terms.push_back({logit(p, b, h, i, j) + std::log(kp.weight[t]), j});
        }
        double mx = -INFINITY;
        for (const auto& tm : terms) mx = std::max(mx, tm.first);
        std::vector<double> num(static_cast<std::size_t>(dv), 0.0);
        double den = 0;
        for (const auto& tm : terms) {
          const double w = std::exp(tm.first - mx);
          den += w;
          for (index_t c = 0; c < dv; ++c) num[static_cast<std::size_t>(c)] += w * p.v(b, h / p.group(), tm.second, c);
        }
        for (double x : num) out.push_back(x / den);
        lse.push_back(mx + std::log(den));
      }
    }
}

void expect_matches_transcription(const KdeformerAttention& m, const AttentionProblem& p, double tol) {
  std::vector<double> out, lse;
  transcription(m, p, out, lse);
  double e = 0, el = 0;
  std::size_t t = 0, r = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i, ++r) {
        for (index_t c = 0; c < p.d_v(); ++c, ++t) e = std::max(e, std::abs(p.out(b, h, i, c) - out[t]));
        el = std::max(el, std::abs(p.lse(b, h, i, 0) - lse[r]) / (1 + std::abs(lse[r])));
      }
  EXPECT_LT(e, tol);
  EXPECT_LT(el, tol);
}

TEST(Kdeformer, EqualsItsFloat64Transcription) {
  RandomProblem prob(config(4, 2, 100, 150, 16, test::base_seed() + 1));
  auto m = create_method("sparse.kdeformer(samples=60,bits=4,bucket=32,seed=3)");
  m->run(prob.problem(), ExecContext{3});
  expect_matches_transcription(as_kde(m), prob.problem(), 2e-6);
  // Some draws fall in the query's own block and are dropped; several blocks exist.
  const auto kp = as_kde(m).key_plan(prob.problem(), 0, 0);
  EXPECT_EQ(as_kde(m).blocks_for(prob.problem()), 5);
  EXPECT_GT(kp.sample.size(), 30u);
}

TEST(Kdeformer, CarriesTheShiftThroughTheRatioAtHugeLogits) {
  // Logits of order 1e4 (exp overflows float64 beyond 709): the official code's raw exp would
  // give inf/inf; the per-row shift keeps numerator and denominator finite.
  ProblemConfig cfg = config(2, 1, 64, 96, 16, test::base_seed() + 2);
  cfg.logit_scale = 2000;
  RandomProblem prob(cfg);
  auto m = create_method("sparse.kdeformer(samples=40,bits=3,bucket=24,seed=1)");
  m->run(prob.problem(), ExecContext{2});
  for (float x : prob.out_data()) ASSERT_TRUE(std::isfinite(x));
  expect_matches_transcription(as_kde(m), prob.problem(), 1e-4);
}

TEST(Kdeformer, KdeLiftingIdentity) {
  // Σ x_i e^{q·k_i} = e^{‖q‖²/2}·C·N·μ(q̃), y_i from x_i e^{‖k_i‖²/2} e^{y_i²/2} = C; the
  // survey's version (Serret et al. 2026, no e^{‖q‖²/2}) is off by that factor.
  const index_t n = 50, d = 6;
  std::vector<double> k(static_cast<std::size_t>(n * d)), x(static_cast<std::size_t>(n)), q(static_cast<std::size_t>(d));
  fill_normal(std::span<double>(k), test::base_seed(), 3);
  fill_normal(std::span<double>(q), test::base_seed(), 4);
  for (index_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = i % 7 == 0 ? 0.0 : 0.1 + std::abs(k[static_cast<std::size_t>(i * d)]);
  for (double& v : k) v *= 0.6;
  for (double& v : q) v *= 0.8;
  const auto lift = KdeformerAttention::kde_lift(k.data(), n, d, x.data());
  const double direct = KdeformerAttention::exp_kde(q.data(), k.data(), n, d, x.data());
  const double lifted = KdeformerAttention::exp_kde_lifted(q.data(), k.data(), n, d, lift);
  EXPECT_NEAR(lifted / direct, 1.0, 1e-12);
  for (index_t i = 0; i < n; ++i) {
    double n2 = 0;
    for (index_t c = 0; c < d; ++c) n2 += k[static_cast<std::size_t>(i * d + c)] * k[static_cast<std::size_t>(i * d + c)];
    const double y = lift.y[static_cast<std::size_t>(i)];
    if (x[static_cast<std::size_t>(i)] == 0) {
      EXPECT_TRUE(std::isinf(y));
      continue;
    }
    EXPECT_NEAR(std::log(x[static_cast<std::size_t>(i)]) + n2 / 2 + y * y / 2, lift.log_c, 1e-12 * (1 + lift.log_c));
  }
  double q2 = 0;
  for (double v : q) q2 += v * v;
  const double survey = std::exp(lift.log_c) * n * KdeformerAttention::gaussian_kde(q.data(), k.data(), n, d, lift);
  EXPECT_NEAR(direct / survey, std::exp(q2 / 2), 1e-10 * std::exp(q2 / 2));
  EXPECT_GT(std::exp(q2 / 2), 1.5);  // the missing factor matters here
}

TEST(Kdeformer, SamplingDistributionIsTheOfficialOne) {
  // Official code: p_j ∝ ‖v̄_j‖/λ_max(V̄ᵀV̄) + 1/N, V̄ = [V | 1]; λ_max by 500 float64 power steps.
  RandomProblem prob(config(2, 2, 8, 120, 8, test::base_seed() + 5));
  const AttentionProblem& p = prob.problem();
  const index_t nk = p.n_kv(), w = p.d_v() + 1;
  std::vector<double> gram(static_cast<std::size_t>(w * w), 0.0), norm(static_cast<std::size_t>(nk));
  for (index_t j = 0; j < nk; ++j) {
    std::vector<double> vb(static_cast<std::size_t>(w), 1.0);
    for (index_t c = 0; c < p.d_v(); ++c) vb[static_cast<std::size_t>(c)] = p.v(0, 1, j, c);
    double n2 = 0;
    for (index_t r = 0; r < w; ++r) {
      n2 += vb[static_cast<std::size_t>(r)] * vb[static_cast<std::size_t>(r)];
      for (index_t c = 0; c < w; ++c) gram[static_cast<std::size_t>(r * w + c)] += vb[static_cast<std::size_t>(r)] * vb[static_cast<std::size_t>(c)];
    }
    norm[static_cast<std::size_t>(j)] = std::sqrt(n2);
  }
  std::vector<double> x(static_cast<std::size_t>(w), 1.0), y(x.size());
  double lambda = 0;
  for (int it = 0; it < 500; ++it) {
    double n2 = 0;
    for (index_t r = 0; r < w; ++r) {
      y[static_cast<std::size_t>(r)] = 0;
      for (index_t c = 0; c < w; ++c) y[static_cast<std::size_t>(r)] += gram[static_cast<std::size_t>(r * w + c)] * x[static_cast<std::size_t>(c)];
      n2 += y[static_cast<std::size_t>(r)] * y[static_cast<std::size_t>(r)];
    }
    lambda = std::sqrt(n2);
    for (index_t r = 0; r < w; ++r) x[static_cast<std::size_t>(r)] = y[static_cast<std::size_t>(r)] / lambda;
  }
  std::vector<double> want(static_cast<std::size_t>(nk));
  double tot = 0;
  for (index_t j = 0; j < nk; ++j) tot += want[static_cast<std::size_t>(j)] = norm[static_cast<std::size_t>(j)] / lambda + 1.0 / nk;
  const std::vector<double> got = KdeformerAttention::sampling_probabilities(p, 0, 1);
  for (index_t j = 0; j < nk; ++j) EXPECT_NEAR(got[static_cast<std::size_t>(j)], want[static_cast<std::size_t>(j)] / tot, 1e-6 / nk);
}

TEST(Kdeformer, OneBlockIsExactAttention) {
  for (index_t nk : {40, 77}) {
    RandomProblem prob(config(4, 1, 40, nk, 32, test::base_seed() + 6));
    create_method(fmt::format("sparse.kdeformer(bucket={},samples=500)", nk))->run(prob.problem(), ExecContext{2});
    const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
    EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error);
    EXPECT_LE(e.max_scaled_error, exact_f32_tolerance(e.logit_magnitude).max_scaled_error);
    EXPECT_LE(e.lse_max_abs_error, exact_f32_tolerance(e.logit_magnitude).lse_max_abs_error);
  }
}

TEST(Kdeformer, ErrorFallsAsTheSamplesGrow) {
  std::vector<double> med;
  for (int m : {16, 128, 1024, 8192}) {
    std::vector<double> e;
    for (int s = 1; s <= 5; ++s) {
      RandomProblem prob(config(2, 2, 128, 512, 32, test::base_seed() + 10 + static_cast<std::uint64_t>(s)));
      create_method(fmt::format("sparse.kdeformer(samples={},bucket=64,seed={})", m, s))->run(prob.problem(), ExecContext{1});
      e.push_back(compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{1})).rel_fro_error);
    }
    std::sort(e.begin(), e.end());
    med.push_back(e[2]);
    std::printf("  kdeformer samples=%d bucket=64 (Nk = 512): median rel_fro_error %.4f\n", m, e[2]);
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "step " << i;
  EXPECT_LT(med.back(), 0.3 * med.front());
}

TEST(Kdeformer, NumeratorAndDenominatorAreUnbiasedOverSeeds) {
  // For any hashes, E[den_i] = Z_i = Σ_j e^{ℓ_ij} and E[num_i] = Σ_j e^{ℓ_ij} v_j
  // (each draw outside the block has mean Σ_{j∉B} e^{ℓ_ij}(·)/m); their ratio is biased. Over S
  // seeds the mean of den_i = e^{lse_i} (and of out_i·den_i) is within 4.5 standard errors.
  RandomProblem prob(config(1, 1, 16, 64, 8, test::base_seed() + 7));
  const AttentionProblem& p = prob.problem();
  const ReferenceRows ref = reference_all(p, ExecContext{1});
  const int S = 400;
  const index_t nq = p.n_q(), dv = p.d_v();
  std::vector<double> sum(static_cast<std::size_t>(nq * (dv + 1)), 0.0), sq(sum.size(), 0.0);
  for (int s = 0; s < S; ++s) {
    create_method(fmt::format("sparse.kdeformer(samples=12,bits=2,bucket=16,seed={})", s))->run(p, ExecContext{1});
    for (index_t i = 0; i < nq; ++i) {
      const double den = std::exp(static_cast<double>(p.lse(0, 0, i, 0)) - ref.lse[static_cast<std::size_t>(i)]);  // / Z_i
      for (index_t c = 0; c <= dv; ++c) {
        const double x = c == dv ? den : p.out(0, 0, i, c) * den;
        sum[static_cast<std::size_t>(i * (dv + 1) + c)] += x;
        sq[static_cast<std::size_t>(i * (dv + 1) + c)] += x * x;
      }
    }
  }
  int outside = 0;
  for (index_t i = 0; i < nq; ++i)
    for (index_t c = 0; c <= dv; ++c) {
      const std::size_t t = static_cast<std::size_t>(i * (dv + 1) + c);
      const double mean = sum[t] / S, var = sq[t] / S - mean * mean;
      const double want = c == dv ? 1.0 : ref.out[static_cast<std::size_t>(i * dv + c)];  // num/Z = exact out
      const double se = std::sqrt(std::max(var, 0.0) / S);
      if (std::abs(mean - want) > 4.5 * se + 1e-6) ++outside;
    }
  EXPECT_EQ(outside, 0);
}

/// Mean over rows of the fraction of the row's true top-k keys that lie in its LSH block
/// (attended exactly), for the method's hashes.
double block_recall(const KdeformerAttention& m, const AttentionProblem& p, index_t k) {
  const index_t nq = p.n_q(), nb = m.blocks_for(p);
  double sum = 0;
  index_t rows = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h) {
      const auto kp = m.key_plan(p, b, h / p.group());
      const auto qo = m.query_order(p, b, h);
      for (index_t s = 0; s < nq; ++s) {
        const index_t i = qo[static_cast<std::size_t>(s)];
        index_t g = 0;
        while ((g + 1) * nq / nb <= s) ++g;
        std::vector<index_t> idx(static_cast<std::size_t>(p.n_kv()));
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                          [&](index_t a, index_t c) { return logit(p, b, h, i, a) > logit(p, b, h, i, c); });
        index_t hit = 0;
        for (index_t t = 0; t < k; ++t) hit += kp.block[static_cast<std::size_t>(idx[static_cast<std::size_t>(t)])] == g;
        sum += static_cast<double>(hit) / static_cast<double>(k);
        ++rows;
      }
    }
  return sum / static_cast<double>(rows);
}

TEST(Kdeformer, LshBlocksHoldTheTopKeysMoreOftenThanRandomBlocks) {
  // 8 blocks of 32 keys: a random block holds 1/8 of a row's top-8 keys; SimHash with Gray order
  // puts queries next to the keys they align with (measured about 2× on Gaussian inputs, more
  // with more bits up to the block size).
  ProblemConfig cfg = config(2, 2, 256, 256, 32, test::base_seed() + 8);
  cfg.logit_scale = 2;
  RandomProblem prob(cfg);
  for (int bits : {2, 4, 7}) {
    auto m = create_method(fmt::format("sparse.kdeformer(bucket=32,bits={},seed=2)", bits));
    const double r = block_recall(as_kde(m), prob.problem(), 8);
    std::printf("  kdeformer bucket=32 bits=%d: top-8 recall of the LSH block %.3f (random block 0.125)\n", bits, r);
    EXPECT_GT(r, 1.5 * 0.125);
  }
}

// Its kernel is non-causal: causal problems go to the causal recursion (method.h), with the
// method's own LSE as the blocks' normalisers.
TEST(Kdeformer, RunsCausalProblemsByTheRecursion) {
  ProblemConfig cfg = config(2, 2, 16, 16, 8, 1);
  cfg.causal = Causal::kTopLeft;
  RandomProblem prob(cfg);
  const auto m = create_method("sparse.kdeformer");
  EXPECT_TRUE(m->runs_by_recursion(prob.problem()));
  EXPECT_TRUE(m->can_run(prob.problem()).is_ok());
}

TEST(Kdeformer, ResultDoesNotDependOnTheThreadCount) {
  RandomProblem prob(config(2, 1, 512, 512, 64, test::base_seed() + 9));
  auto m = create_method("sparse.kdeformer(samples=300,bucket=64,seed=4)");
  m->run(prob.problem(), ExecContext{1});
  const std::vector<float> one = prob.out_data();
  m->run(prob.problem(), ExecContext{3});
  EXPECT_EQ(one, prob.out_data());
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
