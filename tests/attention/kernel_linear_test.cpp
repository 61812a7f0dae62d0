// kernel.linear: the fast float32 result against a dense float64 transcription of
// Σ φ(q)·φ(k) v / Σ φ(q)·φ(k) (both feature maps, causal alignments, GQA), and the relu row whose
// weights all vanish.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention/kernel_dense.h"
#include "numattn/attention/registry.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

double phi(bool relu, double u) { return relu ? std::max(u, 0.0) : (u > 0 ? u + 1 : std::exp(u)); }

TEST(KernelLinear, MatchesDenseTranscription) {
  struct Shape {
    index_t hq, hk, n, nk, d, dv;
    Causal c;
  };
  const Shape shapes[] = {{4, 2, 50, 50, 16, 8, Causal::kNone},
                          {2, 1, 300, 300, 8, 8, Causal::kTopLeft},
                          {2, 2, 40, 90, 8, 12, Causal::kBottomRight},
                          {2, 2, 90, 40, 8, 8, Causal::kBottomRight}};
  for (const Shape& sh : shapes)
    for (bool relu : {false, true}) {
      ProblemConfig cfg;
      cfg.heads = sh.hq;
      cfg.kv_heads = sh.hk;
      cfg.n = sh.n;
      cfg.n_kv = sh.nk;
      cfg.d = sh.d;
      cfg.dv = sh.dv;
      cfg.causal = sh.c;
      cfg.seed = test::base_seed() + static_cast<std::uint64_t>(sh.n);
      cfg.want_lse = false;
      RandomProblem prob(cfg);
      const AttentionProblem& p = prob.problem();
      const double rs = std::sqrt(p.effective_scale());
      auto kappa = [&](index_t b, index_t h, index_t i, index_t j) {
        double s = 0;
        for (index_t k = 0; k < p.d_qk(); ++k)
          s += phi(relu, rs * p.q(b, h, i, k)) * phi(relu, rs * p.k(b, h / p.group(), j, k));
        return s;
      };
      auto m = create_method(relu ? "kernel.linear(feature=relu)" : "kernel.linear");
      for (int t : {1, 2}) {
        m->run(p, ExecContext{t});
        EXPECT_LT(test::rel_error_vs(test::dense_kernel_attention(p, kappa), p), 1e-5)
            << relu << " " << to_string(sh.c) << " n=" << sh.n;
      }
    }
}

TEST(KernelLinear, ReluRowWithNoWeightIsZero) {
  ProblemConfig cfg;
  cfg.heads = 1;
  cfg.n = 4;
  cfg.d = 2;
  cfg.want_lse = false;
  RandomProblem prob(cfg);
  for (index_t i = 0; i < 4; ++i) {  // query 0 is negative, every key positive: all of its weights are 0
    prob.q_data()[static_cast<std::size_t>(2 * i)] = i == 0 ? -1.f : 1.f;
    prob.q_data()[static_cast<std::size_t>(2 * i + 1)] = i == 0 ? -1.f : 0.5f;
    prob.k_data()[static_cast<std::size_t>(2 * i)] = 1.f;
    prob.k_data()[static_cast<std::size_t>(2 * i + 1)] = 0.25f * static_cast<float>(i);
  }
  create_method("kernel.linear(feature=relu)")->run(prob.problem(), ExecContext{1});
  for (index_t d = 0; d < 2; ++d) EXPECT_EQ(prob.problem().out(0, 0, 0, d), 0.f);
  EXPECT_NE(prob.problem().out(0, 0, 1, 0), 0.f);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
