// 2-simplicial attention: both float32 kernels against the float64 oracle (with separate K', V'
// too), the oracle against softmax attention in the one case where they coincide (w2 = 1), the
// FLOP model, and the edge semantics (what a row reads must be finite, nothing else is read).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/registry.h"
#include "numattn/attention/simplicial.h"
#include "numattn/core/cpu.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

struct Shape {
  const char* name;
  index_t h, hk, nq, nk, d, dv;
  Causal causal;
  index_t w1, w2;
  index_t window_left = -1;
};

ReferenceRows oracle(const AttentionProblem& p, const TensorView<const float>& k2, const TensorView<const float>& v2,
                     index_t w1, index_t w2) {
  ReferenceRows r;
  const index_t dv = p.d_v();
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i) {
        r.rows.push_back({b, h, i});
        std::vector<double> o(static_cast<std::size_t>(dv));
        double L = 0;
        r.lse.push_back(simplicial_reference_row(p, k2, v2, w1, w2, b, h, i, o.data(), &L));
        r.out.insert(r.out.end(), o.begin(), o.end());
        r.logit_magnitude = std::max(r.logit_magnitude, L);
      }
  return r;
}

void expect_exact(const AttentionProblem& p, const ReferenceRows& ref, const std::string& what) {
  const ErrorMetrics e = compare_with_reference(p, ref);
  const ExactTolerance tol = exact_f32_tolerance(ref.logit_magnitude);
  EXPECT_TRUE(e.finite) << what;
  EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << what;
  EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << what;
  EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << what;
}

TEST(TensorSimplicial, KernelsMatchTheFloat64OracleWithSeparateSecondKeysAndValues) {
  const Shape shapes[] = {
      {"causal square", 2, 2, 70, 70, 64, 64, Causal::kTopLeft, 64, 16},
      {"GQA bottom-right Nq<Nk odd D", 4, 2, 19, 45, 59, 59, Causal::kBottomRight, 9, 5},
      {"Dk!=Dv top-left Nq>Nk", 2, 1, 40, 17, 3, 24, Causal::kTopLeft, 130, 70},
      {"D=1 no causal, windows 1", 1, 1, 5, 5, 1, 1, Causal::kNone, 1, 1},
      {"window_left 6, long tiles", 1, 1, 150, 150, 16, 130, Causal::kTopLeft, 100, 33, 6},
      {"tiles of 64 with a tail, w2 = 20", 2, 2, 140, 140, 32, 32, Causal::kTopLeft, 128, 20},
  };
  std::uint64_t seed = test::base_seed() + 1400;
  for (const Shape& s : shapes)
    for (CpuPath path : runnable_cpu_paths()) {
      const CpuPathScope scope(path);
      ProblemConfig cfg;
      cfg.heads = s.h;
      cfg.kv_heads = s.hk;
      cfg.n = s.nq;
      cfg.n_kv = s.nk;
      cfg.d = s.d;
      cfg.dv = s.dv;
      cfg.causal = s.causal;
      cfg.seed = ++seed;
      cfg.logit_scale = 1.5;
      cfg.window_left = s.window_left;
      RandomProblem prob(cfg);
      // Separate K', V': another random problem of the same shapes.
      ProblemConfig cfg2 = cfg;
      cfg2.seed = seed + 1000;
      RandomProblem second(cfg2);
      const AttentionProblem& p = prob.problem();
      simplicial_attention(p, second.problem().k, second.problem().v, s.w1, s.w2, ExecContext{2});
      const std::string what = std::string(s.name) + " (path " + cpu_path_name(path) + ")";
      expect_exact(p, oracle(p, second.problem().k, second.problem().v, s.w1, s.w2), what);
    }
}

TEST(TensorSimplicial, WithOneSecondKeyItIsWindowedSoftmaxOfModulatedQueries) {
  // w2 = 1: K_i = {t}, so out_i = v'_t ⊙ Σ_j softmax_j(s·(q_i ⊙ k'_t)·k_j) v_j over the w1
  // window: softmax attention (the project's float64 reference) with q̃_i = q_i ⊙ k'_t. K' holds
  // powers of two so that q̃ is exact in float32 and the two oracles agree to float64 rounding.
  ProblemConfig cfg;
  cfg.heads = 2;
  cfg.n = 50;
  cfg.d = 8;
  cfg.causal = Causal::kTopLeft;
  cfg.seed = test::base_seed() + 1450;
  RandomProblem prob(cfg), second(cfg);
  for (std::size_t t = 0; t < second.k_data().size(); ++t)
    second.k_data()[t] = static_cast<float>((t % 2 ? -1.0 : 1.0) * std::ldexp(1.0, static_cast<int>(t % 3) - 1));
  const AttentionProblem& p = prob.problem();
  const TensorView<const float> k2 = second.problem().k, v2 = second.problem().v;
  const index_t w1 = 7;
  std::vector<double> o(8), r(8);
  ProblemConfig mcfg = cfg;
  mcfg.window_left = w1 - 1;
  RandomProblem mod(mcfg);
  for (index_t h = 0; h < 2; ++h)
    for (index_t i = 0; i < 50; ++i)
      for (index_t d = 0; d < 8; ++d)
        mod.q_data()[static_cast<std::size_t>((h * 50 + i) * 8 + d)] = p.q(0, h, i, d) * k2(0, h, i, d);
  std::copy(prob.k_data().begin(), prob.k_data().end(), mod.k_data().begin());
  std::copy(prob.v_data().begin(), prob.v_data().end(), mod.v_data().begin());
  double worst = 0;
  for (index_t h = 0; h < 2; ++h)
    for (index_t i = 0; i < 50; ++i) {
      const double l1 = simplicial_reference_row(p, k2, v2, w1, 1, 0, h, i, o.data());
      const double l2 = reference_row(mod.problem(), 0, h, i, r.data());
      worst = std::max(worst, std::abs(l1 - l2));
      for (index_t d = 0; d < 8; ++d) worst = std::max(worst, std::abs(o[d] - v2(0, h, i, d) * r[d]));
    }
  EXPECT_LE(worst, 1e-12);
}

TEST(TensorSimplicial, RegisteredMethodReportsItsTargetAndHonestFlops) {
  auto m = create_method("tensor.simplicial(w1=4,w2=2)");
  EXPECT_EQ(m->target().name(), "2-simplicial(w1=4,w2=2)");
  ProblemConfig cfg;
  cfg.heads = 3;
  cfg.n = 10;
  cfg.d = 5;
  cfg.dv = 7;
  cfg.causal = Causal::kTopLeft;
  RandomProblem prob(cfg);
  // Row i sees min(i+1, 4) keys j and min(i+1, 2) keys k.
  double pairs = 0;
  for (index_t i = 0; i < 10; ++i) pairs += static_cast<double>(std::min<index_t>(i + 1, 4) * std::min<index_t>(i + 1, 2));
  EXPECT_DOUBLE_EQ(m->flops(prob.problem()), 2 * pairs * (5 + 7) * 3);
  m->run(prob.problem(), ExecContext{1});
  const ReferenceRows ref = reference_all(prob.problem(), ExecContext{1}, m->target());
  expect_exact(prob.problem(), ref, "registered method");
  // Against softmax attention it is another mechanism: a large rel_fro_error.
  EXPECT_GT(compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{1})).rel_fro_error, 1e-2);
}

TEST(TensorSimplicial, ReadsOnlyItsWindowsAndRefusesBadValuesInside) {
  ProblemConfig cfg;
  cfg.heads = 1;
  cfg.n = 40;
  cfg.d = 8;
  cfg.causal = Causal::kTopLeft;
  cfg.seed = test::base_seed() + 1460;
  auto m = create_method("tensor.simplicial(w1=5,w2=3)");
  {
    RandomProblem prob(cfg);
    // Key 10 is in the j-windows of rows 10..14: a NaN there is refused by name.
    prob.k_data()[10 * 8 + 2] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THROW(m->run(prob.problem(), ExecContext{2}), NonFiniteInput);
  }
  {
    // A NaN in key 30 while only rows 0..29 are asked: never read.
    ProblemConfig c2 = cfg;
    c2.n = 30;
    c2.n_kv = 40;
    RandomProblem short_q(c2);
    short_q.k_data()[30 * 8] = std::numeric_limits<float>::quiet_NaN();
    short_q.v_data()[35 * 8 + 1] = std::numeric_limits<float>::infinity();
    EXPECT_NO_THROW(m->run(short_q.problem(), ExecContext{2}));
    EXPECT_TRUE(compare_with_reference(short_q.problem(), reference_all(short_q.problem(), ExecContext{1}, m->target())).finite);
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
