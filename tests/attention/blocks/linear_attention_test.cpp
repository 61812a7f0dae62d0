// blocks/linear_attention: the block algorithm and the prefix sums against the dense masked
// computation (float64, written apart), both alignments with Nq ≠ Nk, chunk sizes that do and do
// not divide N, self-tensoring, the denominator policies, and thread-count independence.
#include "numattn/attention/blocks/linear_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/kernel_dense.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::base_seed;

struct Case {
  index_t hq, hk, nq, nk, d, dv;
  Causal c;
};

/// Deterministic signed features ψ (the block does not care where they come from).
float feature(index_t b, index_t h, index_t row, index_t col, std::uint64_t stream, bool positive) {
  const CounterRng rng(base_seed(), stream);
  const double u = rng.normal(static_cast<std::uint64_t>(((b * 64 + h) * 4096 + row) * 64 + col));
  return static_cast<float>(positive ? std::exp(0.5 * u) : u);
}

void run_case(const Case& c, index_t m, bool self_tensor, blocks::CausalAlgo algo, index_t chunk,
              blocks::Denominator den, bool positive) {
  ProblemConfig cfg;
  cfg.heads = c.hq;
  cfg.kv_heads = c.hk;
  cfg.n = c.nq;
  cfg.n_kv = c.nk;
  cfg.d = c.d;
  cfg.dv = c.dv;
  cfg.causal = c.c;
  cfg.seed = base_seed() + static_cast<std::uint64_t>(c.nq * 31 + c.nk);
  cfg.want_lse = false;
  RandomProblem prob(cfg);
  const AttentionProblem& p = prob.problem();
  blocks::LinearAttentionConfig lc;
  lc.feature_dim = m;
  lc.self_tensor = self_tensor;
  lc.causal_algo = algo;
  lc.chunk = chunk;
  lc.den = den;
  // Tables of ψ, filled once (the dense loop reads them N² times).
  std::vector<float> tq(static_cast<std::size_t>(p.batch() * p.heads() * c.nq * m));
  std::vector<float> tk(static_cast<std::size_t>(p.batch() * p.kv_heads() * c.nk * m));
  for (index_t h = 0; h < p.heads(); ++h)
    for (index_t i = 0; i < c.nq; ++i)
      for (index_t a = 0; a < m; ++a) tq[static_cast<std::size_t>((h * c.nq + i) * m + a)] = feature(0, h, i, a, 1, positive);
  for (index_t h = 0; h < p.kv_heads(); ++h)
    for (index_t j = 0; j < c.nk; ++j)
      for (index_t a = 0; a < m; ++a) tk[static_cast<std::size_t>((h * c.nk + j) * m + a)] = feature(0, h, j, a, 2, positive);
  auto qf = [&](index_t, index_t h, index_t r0, index_t rows, float* out) {
    std::copy_n(tq.data() + (h * c.nq + r0) * m, rows * m, out);
  };
  auto kf = [&](index_t, index_t h, index_t r0, index_t rows, float* out) {
    std::copy_n(tk.data() + (h * c.nk + r0) * m, rows * m, out);
  };
  auto kappa = [&](index_t, index_t h, index_t i, index_t j) {
    const float* x = tq.data() + (h * c.nq + i) * m;
    const float* y = tk.data() + (h / p.group() * c.nk + j) * m;
    double s = 0;
    for (index_t a = 0; a < m; ++a) s += static_cast<double>(x[a]) * y[a];
    return self_tensor ? s * s : s;
  };
  const std::vector<double> dense = test::dense_kernel_attention(p, kappa, den.shift, den.clamp_nonneg);
  std::vector<float> first;
  for (int t : {1, 2, 3}) {
    const ExecContext ctx{t};
    const std::vector<float> keys = blocks::key_features(p, m, kf, ctx);
    blocks::linear_attention(p, lc, qf, keys.data(), ctx);
    const double e = test::rel_error_vs(dense, p);
    EXPECT_LT(e, positive ? 2e-5 : 2e-3) << "nq=" << c.nq << " nk=" << c.nk << " " << to_string(c.c) << " m=" << m
                                         << " self=" << self_tensor << " chunk=" << chunk << " t=" << t;
    if (t == 1) first = prob.out_data();
    else EXPECT_EQ(first, prob.out_data()) << "result depends on the thread count";
  }
}

TEST(LinearAttentionBlock, MatchesDenseMaskedComputation) {
  const Case cases[] = {{2, 1, 37, 37, 8, 8, Causal::kNone},        {2, 2, 100, 100, 8, 6, Causal::kTopLeft},
                        {4, 2, 33, 90, 8, 8, Causal::kBottomRight}, {2, 1, 90, 33, 8, 5, Causal::kBottomRight},
                        {2, 2, 90, 33, 8, 8, Causal::kTopLeft},     {1, 1, 1, 50, 8, 8, Causal::kBottomRight},
                        {1, 1, 1300, 1300, 4, 4, Causal::kTopLeft}};
  for (const Case& c : cases)
    for (auto algo : {blocks::CausalAlgo::kBlock, blocks::CausalAlgo::kPrefix})
      for (index_t chunk : {16, 25})
        for (bool self : {false, true}) run_case(c, self ? 5 : 12, self, algo, chunk, {}, true);
}

TEST(LinearAttentionBlock, DenominatorPolicies) {
  const Case c{2, 1, 40, 40, 8, 8, Causal::kTopLeft};
  run_case(c, 6, false, blocks::CausalAlgo::kBlock, 16, {1.0, false}, true);   // the "1 +" of PolySketch
  run_case(c, 6, false, blocks::CausalAlgo::kBlock, 16, {1.0, true}, false);   // signed, clamped, shifted
  run_case(c, 6, false, blocks::CausalAlgo::kPrefix, 16, {0.0, true}, false);  // signed, clamped
}

TEST(LinearAttentionBlock, ExactPolynomialEqualsDense) {
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight}) {
    ProblemConfig cfg;
    cfg.heads = 4;
    cfg.kv_heads = 2;
    cfg.n = 70;
    cfg.n_kv = 150;
    cfg.d = 16;
    cfg.causal = c;
    cfg.seed = base_seed() + 5;
    cfg.want_lse = false;
    RandomProblem prob(cfg);
    const AttentionProblem& p = prob.problem();
    const double s = p.effective_scale();
    for (int deg : {2, 4}) {
      auto kappa = [&](index_t b, index_t h, index_t i, index_t j) {
        double dot = 0;
        for (index_t k = 0; k < p.d_qk(); ++k) dot += static_cast<double>(p.q(b, h, i, k)) * p.k(b, h / p.group(), j, k);
        return std::pow(s * dot, deg);
      };
      blocks::exact_polynomial_attention(p, deg, 1.0, ExecContext{2});
      EXPECT_LT(test::rel_error_vs(test::dense_kernel_attention(p, kappa, 1.0), p), 1e-5) << deg << to_string(c);
    }
  }
}

TEST(LinearAttentionBlock, NonFiniteValueReachesOnlyTheRowsThatSeeIt) {
  ProblemConfig cfg;
  cfg.heads = 1;
  cfg.n = 40;
  cfg.d = 4;
  cfg.causal = Causal::kTopLeft;
  cfg.seed = base_seed();
  cfg.want_lse = false;
  RandomProblem prob(cfg);
  const AttentionProblem& p = prob.problem();
  prob.v_data()[static_cast<std::size_t>(21 * 4 + 1)] = std::numeric_limits<float>::quiet_NaN();  // key 21
  blocks::LinearAttentionConfig lc;
  lc.feature_dim = 3;
  lc.chunk = 16;
  auto f = [&](index_t, index_t, index_t, index_t rows, float* out) { std::fill(out, out + rows * 3, 1.f); };
  const std::vector<float> keys = blocks::key_features(p, 3, f, ExecContext{1});
  blocks::linear_attention(p, lc, f, keys.data(), ExecContext{1});
  for (index_t i = 0; i < 40; ++i)
    EXPECT_EQ(std::isnan(p.out(0, 0, i, 1)), i >= 21) << i;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
