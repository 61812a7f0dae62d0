// sparse.topk against a float64 transcription (top-k visible keys per row by the exact float64
// logits, softmax over them), recall of each row's true top-k (1 up to float32 ties), the limit
// k ≥ N (exact attention), error falling as k grows, causal rows never reading future keys,
// and KV-cache decoding in the tiny Llama (prefill = decode).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "attention/sparse/topk.h"
#include "numattn/attention/registry.h"
#include "sparse_decode_util.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, Causal c, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d + 2, c, test::base_seed() + seed, Dist::kGaussian, true);
}

std::string spec(index_t k) { return "sparse.topk(k=" + std::to_string(k) + ")"; }

/// Float64 logits of the keys row (b, h, i) sees (−inf for the others, and for additive −inf).
std::vector<double> logits(const AttentionProblem& p, index_t b, index_t h, index_t i) {
  std::vector<double> s(static_cast<std::size_t>(p.n_kv()), kNegInf);
  for (index_t j = 0; j < p.n_kv(); ++j) {
    if (!p.visible(i, j)) continue;
    double a = 0;
    if (p.mask.kind == MaskKind::kAdditive) {
      a = p.mask.additive[i * p.mask.ld + j];
      if (!(a > kNegInf)) continue;
    }
    double x = 0;
    for (index_t c = 0; c < p.d_qk(); ++c) x += double(p.q(b, h, i, c)) * p.k(b, h / p.group(), j, c);
    s[static_cast<std::size_t>(j)] = p.effective_scale() * x + a;
  }
  return s;
}

/// The row's true top-k keys (float64 logits; ties: lower index), increasing.
std::vector<index_t> true_topk(const std::vector<double>& s, index_t k) {
  std::vector<index_t> idx;
  for (index_t j = 0; j < static_cast<index_t>(s.size()); ++j)
    if (s[static_cast<std::size_t>(j)] > kNegInf) idx.push_back(j);
  std::stable_sort(idx.begin(), idx.end(), [&](index_t a, index_t c) { return s[static_cast<std::size_t>(a)] > s[static_cast<std::size_t>(c)]; });
  if (static_cast<index_t>(idx.size()) > k) idx.resize(static_cast<std::size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(SparseTopk, MatchesTheFloat64TranscriptionWithFullRecall) {
  struct Shape {
    index_t h, hk, n, nk, d;
    Causal c;
    index_t wl = -1;
    bool additive = false;
  };
  const Shape shapes[] = {{4, 2, 70, 70, 16, Causal::kBottomRight}, {2, 2, 20, 90, 8, Causal::kBottomRight},
                          {3, 1, 45, 30, 8, Causal::kTopLeft},      {2, 1, 33, 50, 5, Causal::kNone},
                          {2, 2, 40, 40, 8, Causal::kNone, 9},      {2, 2, 30, 41, 8, Causal::kBottomRight, -1, true}};
  int n = 0;
  double recall_sum = 0, rows = 0, recall_min = 1;
  for (const Shape& s : shapes)
    for (index_t k : {1, 3, 8, 25}) {
      ProblemConfig cfg = config(s.h, s.hk, s.n, s.nk, s.d, s.c, ++n);
      cfg.window_left = s.wl;
      RandomProblem prob(cfg);
      if (s.additive) {
        std::vector<float> add(static_cast<std::size_t>(s.n * s.nk));
        for (std::size_t u = 0; u < add.size(); ++u) add[u] = u % 7 == 0 ? -INFINITY : float(u % 5) * 0.3f - 0.6f;
        prob.set_additive_mask(add);
      }
      const AttentionProblem& p = prob.problem();
      create_method(spec(k))->run(p, ExecContext{2});
      double worst = 0, worst_lse = 0;
      for (index_t b = 0; b < p.batch(); ++b)
        for (index_t h = 0; h < p.heads(); ++h)
          for (index_t i = 0; i < p.n_q(); ++i) {
            const std::vector<double> sc = logits(p, b, h, i);
            const std::vector<index_t> want = true_topk(sc, k);
            const std::vector<index_t> got = TopkAttention::selected_keys(p, b, h, i, k);
            // Recall: the fraction of the row's true top-k that the method attends to.
            if (!want.empty()) {
              index_t hit = 0;
              for (index_t j : want) hit += std::binary_search(got.begin(), got.end(), j);
              const double rc = double(hit) / double(want.size());
              recall_sum += rc, rows += 1, recall_min = std::min(recall_min, rc);
            }
            // Transcription: softmax over the true top-k, in float64.
            std::vector<double> o(static_cast<std::size_t>(p.d_v()), 0.0);
            double lse = kNegInf;
            if (!want.empty()) {
              double m = kNegInf, z = 0;
              for (index_t j : want) m = std::max(m, sc[static_cast<std::size_t>(j)]);
              for (index_t j : want) {
                const double w = std::exp(sc[static_cast<std::size_t>(j)] - m);
                z += w;
                for (index_t e = 0; e < p.d_v(); ++e) o[static_cast<std::size_t>(e)] += w * p.v(b, h / p.group(), j, e);
              }
              for (double& x : o) x /= z;
              lse = m + std::log(z);
            }
            for (index_t e = 0; e < p.d_v(); ++e)
              worst = std::max(worst, std::abs(p.out(b, h, i, e) - o[static_cast<std::size_t>(e)]) / (1 + std::abs(o[static_cast<std::size_t>(e)])));
            if (lse == kNegInf) EXPECT_EQ(p.lse(b, h, i, 0), kNegInf);
            else worst_lse = std::max(worst_lse, std::abs(p.lse(b, h, i, 0) - lse) / (1 + std::abs(lse)));
          }
      EXPECT_LT(worst, 1e-5) << spec(k) << " shape " << n;
      EXPECT_LT(worst_lse, 1e-6) << spec(k) << " shape " << n;
    }
  std::printf("sparse.topk recall of the true top-k over %.0f rows: mean %.6f, min %.3f\n", rows, recall_sum / rows, recall_min);
  EXPECT_EQ(recall_min, 1.0);  // Gaussian logits have no float32 near-ties here
}

TEST(SparseTopk, KAtLeastNIsExactAttention) {
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight}) {
    RandomProblem prob(config(4, 2, 50, 70, 16, c, 50));
    const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
    for (index_t k : {70, 1000}) {
      create_method(spec(k))->run(prob.problem(), ExecContext{2});
      const ErrorMetrics e = compare_with_reference(prob.problem(), ref);
      const ExactTolerance tol = exact_f32_tolerance(ref.logit_magnitude);
      EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << k;
      EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << k;
      EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << k;
    }
  }
}

TEST(SparseTopk, ErrorFallsAsKGrows) {
  const index_t ks[] = {1, 8, 32, 128, 256};
  std::vector<double> med;
  for (index_t k : ks) {
    std::vector<double> err;
    for (int seed = 0; seed < 5; ++seed) {
      ProblemConfig cfg = config(2, 1, 256, 256, 32, Causal::kBottomRight, 100 + seed);
      cfg.logit_scale = 2;
      RandomProblem prob(cfg);
      const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
      create_method(spec(k))->run(prob.problem(), ExecContext{2});
      err.push_back(compare_with_reference(prob.problem(), ref).rel_fro_error);
    }
    std::sort(err.begin(), err.end());
    med.push_back(err[2]);
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << i;
  EXPECT_LT(med.back(), 1e-5);
  std::printf("sparse.topk causal N=256 logits x2, median rel_fro_error at k=1/8/32/128/256: %.3g %.3g %.3g %.3g %.3g\n",
              med[0], med[1], med[2], med[3], med[4]);
}

TEST(SparseTopk, CausalRowsNeverReadFutureKeys) {
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight})
    for (index_t k : {1, 7, 200}) {
      const ProblemConfig cfg = config(4, 2, 70, 90, 16, c, 300);
      for (index_t i : {0, 13, 40, 69}) {
        RandomProblem bad(cfg);
        test::expect_rows_ignore_future_keys(spec(k), bad, i, test::KeyPoison::kSetTo1e30);
      }
    }
}

TEST(SparseTopk, KvCacheDecodeEqualsPrefill) {
  const test::TinyTensors T = test::make_tiny(false);
  const LlamaModel m = LlamaModel::load(test::write_gguf(T, "tiny_topk.gguf"), ExecContext{2});
  const auto toks = test::decode_tokens(40, 12);
  for (index_t k : {4, 16}) {
    const test::DecodeRun r = test::prefill_vs_decode(m, spec(k), toks, 9);
    EXPECT_LT(test::max_abs_diff(r.prefill, r.decode), 1e-4) << k;
  }
  const test::DecodeRun t = test::prefill_vs_decode(m, spec(4), toks, 39);
  const test::DecodeRun e = test::prefill_vs_decode(m, "exact.flash", toks, 39);
  EXPECT_GT(test::max_abs_diff(t.prefill, e.prefill), 1e-3);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
