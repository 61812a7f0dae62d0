// kernel.levattention against a float64 transcription of LevAttention (Kannan et al., ICLR 2025):
// leverage scores from the dense formula kⱼ(KᵀK)⁺kⱼᵀ (non-causal) or the online definition
// kⱼ(K_{≤j}ᵀK_{≤j} + λI)⁻¹kⱼᵀ (causal), the top `keys`, dense softmax over them; limit case, error
// falling as the universal set grows.
#include <gtest/gtest.h>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "numattn/attention/registry.h"
#include "numattn/decomp/dense.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

RowMat keys_of(const AttentionProblem& p, index_t b, index_t hk, index_t n) {
  RowMat K(n, p.d_qk());
  for (index_t j = 0; j < n; ++j)
    for (index_t c = 0; c < p.d_qk(); ++c) K(j, c) = p.k(b, hk, j, c);
  return K;
}

/// The `s` best keys of `score` among [0, n) (larger score, then lower index).
std::vector<index_t> top(const std::vector<double>& score, index_t n, index_t s) {
  std::vector<index_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](index_t a, index_t b) {
    return score[static_cast<std::size_t>(a)] > score[static_cast<std::size_t>(b)];
  });
  idx.resize(static_cast<std::size_t>(std::min(s, n)));
  return idx;
}

/// float64 softmax attention of row (b, h, i) over `keys`.
std::vector<double> attend(const AttentionProblem& p, index_t b, index_t h, index_t i, const std::vector<index_t>& keys) {
  const index_t hk = h / p.group();
  std::vector<double> logit;
  double m = -INFINITY;
  for (index_t j : keys) {
    double s = 0;
    for (index_t c = 0; c < p.d_qk(); ++c) s += static_cast<double>(p.q(b, h, i, c)) * p.k(b, hk, j, c);
    logit.push_back(s * p.effective_scale());
    m = std::max(m, logit.back());
  }
  std::vector<double> o(static_cast<std::size_t>(p.d_v()), 0.0);
  double z = 0;
  for (std::size_t t = 0; t < keys.size(); ++t) {
    const double w = std::exp(logit[t] - m);
    z += w;
    for (index_t c = 0; c < p.d_v(); ++c) o[static_cast<std::size_t>(c)] += w * p.v(b, hk, keys[t], c);
  }
  for (double& x : o) x = z > 0 ? x / z : 0;
  return o;
}

/// ‖out − ref‖_F / ‖ref‖_F over all rows, `ref(b, h, i)` giving the float64 row.
template <class Ref>
double rel_error(const AttentionProblem& p, const Ref& ref) {
  double num = 0, den = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i) {
        const std::vector<double> r = ref(b, h, i);
        for (index_t c = 0; c < p.d_v(); ++c) {
          const double e = p.out(b, h, i, c) - r[static_cast<std::size_t>(c)];
          num += e * e;
          den += r[static_cast<std::size_t>(c)] * r[static_cast<std::size_t>(c)];
        }
      }
  return std::sqrt(num / std::max(den, 1e-300));
}

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, Causal c, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d + 3, c, seed, Dist::kSpiky);
}

TEST(LevAttention, NonCausalEqualsItsFloat64Transcription) {
  RandomProblem prob(config(4, 2, 50, 90, 12, Causal::kNone, test::base_seed()));
  const AttentionProblem& p = prob.problem();
  const index_t s = 10;
  create_method("kernel.levattention(keys=10)")->run(p, ExecContext{3});
  std::vector<std::vector<index_t>> U;
  for (index_t hk = 0; hk < 2; ++hk) {
    const RowMat K = keys_of(p, 0, hk, 90);
    const Eigen::MatrixXd Gp = decomp::dense::pinv(K.transpose() * K);
    std::vector<double> lev(90);
    for (index_t j = 0; j < 90; ++j) lev[static_cast<std::size_t>(j)] = K.row(j) * Gp * K.row(j).transpose();
    U.push_back(top(lev, 90, s));
  }
  const double err = rel_error(p, [&](index_t b, index_t h, index_t i) { return attend(p, b, h, i, U[static_cast<std::size_t>(h / 2)]); });
  EXPECT_LT(err, 2e-6);
}

TEST(LevAttention, CausalEqualsOnlineLeverageTopKOfEachPrefix) {
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight})
    for (auto [n, nk] : {std::pair<index_t, index_t>{70, 70}, {40, 75}, {80, 33}}) {
      RandomProblem prob(config(2, 1, n, nk, 8, c, test::base_seed() + static_cast<std::uint64_t>(n)));
      const AttentionProblem& p = prob.problem();
      const index_t s = 6;
      create_method("kernel.levattention(keys=6)")->run(p, ExecContext{2});
      const index_t used = p.key_range(n - 1).end;
      const RowMat K = keys_of(p, 0, 0, nk);
      double norm2 = 0;
      for (index_t j = 0; j < used; ++j) norm2 = std::max(norm2, K.row(j).squaredNorm());
      const double lambda = 1e-12 * norm2;
      std::vector<double> on(static_cast<std::size_t>(nk), 0.0);
      for (index_t j = 0; j < used; ++j) {
        const Eigen::MatrixXd M = K.topRows(j + 1).transpose() * K.topRows(j + 1) + lambda * Eigen::MatrixXd::Identity(8, 8);
        on[static_cast<std::size_t>(j)] = K.row(j).dot(decomp::dense::cholesky_solve(M, K.row(j).transpose()).x.col(0));
      }
      const double err = rel_error(p, [&](index_t b, index_t h, index_t i) {
        return attend(p, b, h, i, top(on, p.key_range(i).end, s));
      });
      EXPECT_LT(err, 2e-6) << to_string(c) << " n=" << n << " nk=" << nk;
    }
}

TEST(LevAttention, AllKeysIsExactAttention) {
  for (Causal c : {Causal::kNone, Causal::kBottomRight}) {
    RandomProblem prob(config(3, 3, 33, 47, 16, c, test::base_seed() + 5));
    create_method("kernel.levattention(keys=47)")->run(prob.problem(), ExecContext{2});
    const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
    EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error);
    EXPECT_LE(e.max_scaled_error, exact_f32_tolerance(e.logit_magnitude).max_scaled_error);
  }
}

TEST(LevAttention, ErrorFallsAsTheUniversalSetGrows) {
  std::vector<double> med;
  for (index_t s : {4, 16, 64, 160}) {
    std::vector<double> e;
    for (std::uint64_t seed = 0; seed < 5; ++seed) {
      ProblemConfig cfg = config(2, 2, 64, 200, 16, Causal::kNone, test::base_seed() + 10 + seed);
      RandomProblem prob(cfg);
      create_method("kernel.levattention(keys=" + std::to_string(s) + ")")->run(prob.problem(), ExecContext{2});
      e.push_back(compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2})).rel_fro_error);
    }
    std::sort(e.begin(), e.end());
    med.push_back(e[2]);
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "step " << i;
}

TEST(LevAttention, KeepsTheKeyThatOwnsADirection) {
  // Keys in a 3-dim subspace except one: its leverage score is 1, so it is always in U, and a
  // query aligned with it attends to it.
  ProblemConfig cfg = config(1, 1, 4, 100, 8, Causal::kNone, test::base_seed() + 20);
  cfg.dist = Dist::kGaussian;
  RandomProblem prob(cfg);
  for (index_t j = 0; j < 100; ++j)
    for (index_t c = 3; c < 8; ++c) prob.k_data()[static_cast<std::size_t>(j * 8 + c)] = 0.f;
  prob.k_data()[57 * 8 + 6] = 0.5f;
  for (index_t c = 0; c < 8; ++c) prob.q_data()[static_cast<std::size_t>(c)] = c == 6 ? 100.f : 0.f;
  const AttentionProblem& p = prob.problem();
  create_method("kernel.levattention(keys=4)")->run(p, ExecContext{1});
  for (index_t c = 0; c < p.d_v(); ++c) EXPECT_NEAR(p.out(0, 0, 0, c), p.v(0, 0, 57, c), 1e-3);
}

// Its kernel has no window: a windowed problem goes to the causal recursion (method.h); masks
// are refused.
TEST(LevAttention, RunsWindowsByTheRecursionAndRefusesMasks) {
  ProblemConfig cfg = config(1, 1, 8, 8, 4, Causal::kNone, 1);
  cfg.window_left = 2;
  RandomProblem prob(cfg);
  const auto m = create_method("kernel.levattention");
  EXPECT_TRUE(m->runs_by_recursion(prob.problem()));
  EXPECT_TRUE(m->can_run(prob.problem()).is_ok());
  prob.set_bool_mask(std::vector<std::uint8_t>(64, 1));
  EXPECT_FALSE(m->can_run(prob.problem()).is_ok());
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
