// kernel.tensorsketch: against a dense float64 transcription with the same CountSketches (signed
// weights, the clamp-then-"1 +" denominator), causal variants included, the exact-tensor limit, and
// the error falling as the sketch grows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
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

TEST(KernelTensorSketch, MatchesDenseTranscription) {
  struct Shape {
    index_t hq, hk, n, nk;
    Causal c;
  };
  const Shape shapes[] = {{2, 1, 60, 60, Causal::kNone}, {2, 2, 300, 300, Causal::kTopLeft},
                          {4, 2, 40, 100, Causal::kBottomRight}, {2, 1, 100, 40, Causal::kBottomRight}};
  std::uint64_t seed = test::base_seed();
  for (const Shape& sh : shapes)
    for (int degree : {2, 4}) {
      RandomProblem prob(config(sh.hq, sh.hk, sh.n, sh.nk, 8, sh.c, ++seed));
      const AttentionProblem& p = prob.problem();
      const index_t r = 64;
      const double rs = std::sqrt(p.effective_scale());
      std::vector<std::vector<double>> fq, fk;
      auto feat = [&](index_t hk, const float* x) {
        decomp::TensorSketch ts(p.d_qk(), r, degree, 3, static_cast<std::uint64_t>(hk));
        std::vector<double> xs(static_cast<std::size_t>(p.d_qk())), out(static_cast<std::size_t>(r));
        for (index_t k = 0; k < p.d_qk(); ++k) xs[static_cast<std::size_t>(k)] = rs * x[k];
        ts.apply(xs.data(), out.data());
        return out;
      };
      for (index_t h = 0; h < p.heads(); ++h)
        for (index_t i = 0; i < p.n_q(); ++i) fq.push_back(feat(h / p.group(), p.q.row(0, h, i)));
      for (index_t h = 0; h < p.kv_heads(); ++h)
        for (index_t j = 0; j < p.n_kv(); ++j) fk.push_back(feat(h, p.k.row(0, h, j)));
      auto kappa = [&](index_t, index_t h, index_t i, index_t j) {
        const auto& a = fq[static_cast<std::size_t>(h * p.n_q() + i)];
        return std::inner_product(a.begin(), a.end(), fk[static_cast<std::size_t>(h / p.group() * p.n_kv() + j)].begin(), 0.0);
      };
      const std::vector<double> dense = test::dense_kernel_attention(p, kappa, 1.0, true);
      auto m = create_method(fmt::format("kernel.tensorsketch(degree={},sketch={},seed=3)", degree, r));
      for (int t : {1, 2}) {
        m->run(p, ExecContext{t});
        EXPECT_LT(test::rel_error_vs(dense, p), 1e-4) << degree << " " << to_string(sh.c);
      }
    }
}

TEST(KernelTensorSketch, ExactTensorModeIsThePolynomialTarget) {
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight}) {
    RandomProblem prob(config(4, 2, 50, 80, 16, c, test::base_seed() + 9));
    for (const char* spec : {"kernel.tensorsketch(exact=true)", "kernel.tensorsketch(exact=true,degree=4)"}) {
      auto m = create_method(spec);
      m->run(prob.problem(), ExecContext{2});
      const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2}, m->target());
      const ErrorMetrics e = compare_with_reference(prob.problem(), ref);
      EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error) << spec << to_string(c);
    }
  }
}

TEST(KernelTensorSketch, ErrorFallsAsTheSketchGrows) {
  ProblemConfig cfg = config(2, 2, 64, 64, 16, Causal::kNone, test::base_seed() + 11);
  cfg.scale = 0.1;
  RandomProblem prob(cfg);
  std::vector<double> med;
  for (int r : {16, 128, 1024}) {
    std::vector<double> e;
    for (int s = 1; s <= 7; ++s) {
      auto m = create_method(fmt::format("kernel.tensorsketch(sketch={},seed={})", r, s));
      m->run(prob.problem(), ExecContext{2});
      const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2}, m->target());
      e.push_back(compare_with_reference(prob.problem(), ref).rel_fro_error);
    }
    std::sort(e.begin(), e.end());
    med.push_back(e[3]);
    std::printf("tensorsketch sketch=%d median target rel_fro_error %.4f\n", r, med.back());
  }
  EXPECT_LT(med[1], med[0]);
  EXPECT_LT(med[2], 0.6 * med[1]);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
