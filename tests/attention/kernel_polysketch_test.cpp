// kernel.polysketch: against a dense float64 transcription of the self-tensored sketch (same
// draws), the causal block algorithm equal to the dense tril((Q'K'ᵀ)^{⊙2})[V | 1] for several
// grains (Kacham, Mirrokni & Zhong, ICML 2024), the exact-tensor limit, and the error falling as
// the sketch grows.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstdio>
#include <vector>

#include "attention/kernel_dense.h"
#include "numattn/attention/registry.h"
#include "numattn/decomp/sketch.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

ProblemConfig config(index_t hq, index_t hk, index_t n, index_t nk, index_t d, Causal c, std::uint64_t seed) {
  return test::method_problem(hq, hk, n, nk, d, d, c, seed);
}

/// ψ = φ_{p/2}(√s x) with the method's draws (seed, stream hk·16 + level), in float64.
std::vector<double> psi(const AttentionProblem& p, int degree, index_t r, std::uint64_t seed, index_t hk, const float* x) {
  std::vector<double> cur(static_cast<std::size_t>(p.d_qk()));
  const double rs = std::sqrt(p.effective_scale());
  for (index_t k = 0; k < p.d_qk(); ++k) cur[static_cast<std::size_t>(k)] = rs * x[k];
  int level = 0;
  for (int m = degree / 2; m > 1; m /= 2, ++level) {
    decomp::GaussianSketch2 g(static_cast<index_t>(cur.size()), r, seed, static_cast<std::uint64_t>(hk * 16 + level));
    std::vector<double> next(static_cast<std::size_t>(r));
    g.apply(cur.data(), next.data());
    cur.swap(next);
  }
  return cur;
}

TEST(KernelPolySketch, MatchesDenseTranscriptionAndBlockIdentity) {
  struct Shape {
    index_t hq, hk, n, nk;
    Causal c;
  };
  const Shape shapes[] = {{2, 1, 60, 60, Causal::kNone}, {2, 2, 130, 130, Causal::kTopLeft},
                          {4, 2, 40, 100, Causal::kBottomRight}, {2, 1, 100, 40, Causal::kBottomRight}};
  std::uint64_t seed = test::base_seed();
  for (const Shape& sh : shapes)
    for (int degree : {4, 8})
      for (int grain : {16, 32, 50}) {
        RandomProblem prob(config(sh.hq, sh.hk, sh.n, sh.nk, 16, sh.c, ++seed));
        const AttentionProblem& p = prob.problem();
        const index_t r = 8;
        std::vector<std::vector<double>> fq, fk;
        for (index_t h = 0; h < p.heads(); ++h)
          for (index_t i = 0; i < p.n_q(); ++i) fq.push_back(psi(p, degree, r, 5, h / p.group(), p.q.row(0, h, i)));
        for (index_t h = 0; h < p.kv_heads(); ++h)
          for (index_t j = 0; j < p.n_kv(); ++j) fk.push_back(psi(p, degree, r, 5, h, p.k.row(0, h, j)));
        auto kappa = [&](index_t, index_t h, index_t i, index_t j) {
          const double x = std::inner_product(fq[static_cast<std::size_t>(h * p.n_q() + i)].begin(),
                                              fq[static_cast<std::size_t>(h * p.n_q() + i)].end(),
                                              fk[static_cast<std::size_t>(h / p.group() * p.n_kv() + j)].begin(), 0.0);
          return x * x;
        };
        const std::vector<double> dense = test::dense_kernel_attention(p, kappa, 1.0);
        auto m = create_method(fmt::format("kernel.polysketch(degree={},sketch={},grain={},seed=5)", degree, r, grain));
        for (int t : {1, 3}) {
          m->run(p, ExecContext{t});
          EXPECT_LT(test::rel_error_vs(dense, p), 2e-4) << degree << " grain " << grain << " " << to_string(sh.c);
        }
      }
}

TEST(KernelPolySketch, ExactTensorModeIsThePolynomialTarget) {
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight}) {
    RandomProblem prob(config(4, 2, 50, 80, 16, c, test::base_seed() + 9));
    auto m = create_method("kernel.polysketch(exact=true)");
    m->run(prob.problem(), ExecContext{2});
    const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2}, m->target());
    const ErrorMetrics e = compare_with_reference(prob.problem(), ref);
    EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error) << to_string(c);
  }
}

TEST(KernelPolySketch, ErrorFallsAsTheSketchGrows) {
  RandomProblem prob(config(2, 2, 64, 64, 16, Causal::kTopLeft, test::base_seed() + 11));
  std::vector<double> med;
  for (int r : {2, 8, 32}) {
    std::vector<double> e;
    for (int s = 1; s <= 7; ++s) {
      auto m = create_method(fmt::format("kernel.polysketch(sketch={},seed={})", r, s));
      m->run(prob.problem(), ExecContext{2});
      const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2}, m->target());
      e.push_back(compare_with_reference(prob.problem(), ref).rel_fro_error);
    }
    std::sort(e.begin(), e.end());
    med.push_back(e[3]);
    std::printf("polysketch sketch=%d median target rel_fro_error %.4f\n", r, med.back());
  }
  EXPECT_LT(med[1], med[0]);
  EXPECT_LT(med[2], med[1]);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
