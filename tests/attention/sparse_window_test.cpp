// sparse.window against a float64 transcription of its definition (band about the diagonal ∪
// the first `sinks` keys, among the keys the problem lets a row see; exact softmax over them),
// its limit cases (exact attention), error falling as the band widens, the disjoint-support LSE
// merge identity, causal rows never reading future keys, and KV-cache decoding
// in the tiny Llama (prefill = decode; only the visible span of the cache is read).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/sparse/window.h"
#include "numattn/attention/registry.h"
#include "sparse_decode_util.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, Causal c, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d + 3, c, test::base_seed() + seed, Dist::kGaussian, true);
}

std::string spec(index_t l, index_t r, index_t s) {
  return "sparse.window(left=" + std::to_string(l) + ",right=" + std::to_string(r) + ",sinks=" + std::to_string(s) + ")";
}

/// Float64 row of the definition: keys j the problem lets row i see with d − L ≤ j ≤ d + R or
/// j < S (d = i + Nk − Nq for bottom-right, i otherwise); softmax over them. Returns the LSE.
double transcribed_row(const AttentionProblem& p, index_t b, index_t h, index_t i, index_t L, index_t R,
                       index_t S, std::vector<double>& o) {
  const index_t d = i + (p.causal == Causal::kBottomRight ? p.n_kv() - p.n_q() : 0);
  std::vector<index_t> keys;
  std::vector<double> s;
  for (index_t j = 0; j < p.n_kv(); ++j) {
    if (!p.visible(i, j) || !((j >= d - L && j <= d + R) || j < S)) continue;
    double a = 0;
    if (p.mask.kind == MaskKind::kAdditive) {
      a = p.mask.additive[i * p.mask.ld + j];
      if (!(a > kNegInf)) continue;
    }
    double x = 0;
    for (index_t c = 0; c < p.d_qk(); ++c) x += double(p.q(b, h, i, c)) * p.k(b, h / p.group(), j, c);
    keys.push_back(j);
    s.push_back(p.effective_scale() * x + a);
  }
  o.assign(static_cast<std::size_t>(p.d_v()), 0.0);
  if (keys.empty()) return kNegInf;
  const double m = *std::max_element(s.begin(), s.end());
  double z = 0;
  for (std::size_t c = 0; c < keys.size(); ++c) {
    const double w = std::exp(s[c] - m);
    z += w;
    for (index_t e = 0; e < p.d_v(); ++e) o[static_cast<std::size_t>(e)] += w * p.v(0 + b, h / p.group(), keys[c], e);
  }
  for (double& x : o) x /= z;
  return m + std::log(z);
}

/// Max over rows of |out − transcription| / (1 + |transcription|) and of the LSE difference.
void expect_matches_transcription(const AttentionProblem& p, index_t L, index_t R, index_t S, const std::string& what) {
  std::vector<double> o;
  double worst = 0, worst_lse = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i) {
        const double lse = transcribed_row(p, b, h, i, L, R, S, o);
        for (index_t e = 0; e < p.d_v(); ++e)
          worst = std::max(worst, std::abs(p.out(b, h, i, e) - o[static_cast<std::size_t>(e)]) /
                                      (1 + std::abs(o[static_cast<std::size_t>(e)])));
        const double got = p.lse(b, h, i, 0);
        if (lse == kNegInf) EXPECT_EQ(got, kNegInf) << what;
        else worst_lse = std::max(worst_lse, std::abs(got - lse) / (1 + std::abs(lse)));
      }
  EXPECT_LT(worst, 1e-5) << what;
  EXPECT_LT(worst_lse, 1e-6) << what;
}

TEST(SparseWindow, MatchesTheFloat64TranscriptionOnEveryShape) {
  struct Shape {
    index_t h, hk, n, nk, d;
    Causal c;
    index_t wl = -1, wr = -1;
    bool additive = false;
  };
  const Shape shapes[] = {{4, 2, 37, 37, 16, Causal::kBottomRight}, {2, 2, 20, 45, 8, Causal::kBottomRight},
                          {3, 1, 45, 20, 8, Causal::kTopLeft},      {2, 1, 33, 50, 5, Causal::kNone},
                          {2, 2, 40, 40, 8, Causal::kNone, 9, 2},   {2, 2, 30, 41, 8, Causal::kBottomRight, -1, -1, true}};
  const index_t params[][3] = {{3, 0, 2}, {5, 2, 0}, {7, 5, 9}, {0, 0, 1}, {16, 16, 4}, {200, 0, 3}};
  int n = 0;
  for (const Shape& s : shapes)
    for (const auto& pr : params) {
      ProblemConfig cfg = config(s.h, s.hk, s.n, s.nk, s.d, s.c, ++n);
      cfg.window_left = s.wl;
      cfg.window_right = s.wr;
      RandomProblem prob(cfg);
      if (s.additive) {
        std::vector<float> add(static_cast<std::size_t>(s.n * s.nk));
        for (std::size_t u = 0; u < add.size(); ++u) add[u] = u % 7 == 0 ? -INFINITY : float(u % 5) * 0.3f - 0.6f;
        prob.set_additive_mask(add);
      }
      create_method(spec(pr[0], pr[1], pr[2]))->run(prob.problem(), ExecContext{2});
      expect_matches_transcription(prob.problem(), pr[0], pr[1], pr[2], spec(pr[0], pr[1], pr[2]) + " shape " + std::to_string(n));
      // The exposed key set is the transcription's.
      const AttentionProblem& p = prob.problem();
      const index_t i = s.n - 1, d = i + (p.causal == Causal::kBottomRight ? p.n_kv() - p.n_q() : 0);
      std::vector<index_t> want;
      for (index_t j = 0; j < p.n_kv(); ++j)
        if (p.visible(i, j) && ((j >= d - pr[0] && j <= d + pr[1]) || j < pr[2])) want.push_back(j);
      EXPECT_EQ(WindowAttention::attended_keys(p, i, pr[0], pr[1], pr[2]), want);
    }
}

TEST(SparseWindow, WideBandOrAllSinksIsExactAttention) {
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight}) {
    RandomProblem prob(config(4, 2, 50, 70, 16, c, 50));
    const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
    for (const std::string s : {spec(120, 120, 0), spec(0, 0, 70), spec(3, 70, 70)}) {
      create_method(s)->run(prob.problem(), ExecContext{2});
      const ErrorMetrics e = compare_with_reference(prob.problem(), ref);
      const ExactTolerance tol = exact_f32_tolerance(ref.logit_magnitude);
      EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << s;
      EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << s;
      EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << s;
    }
  }
}

TEST(SparseWindow, ErrorFallsAsTheBandWidens) {
  std::vector<double> med;
  for (index_t left : {4, 16, 64, 256}) {
    std::vector<double> err;
    for (int seed = 0; seed < 5; ++seed) {
      ProblemConfig cfg = config(2, 1, 256, 256, 32, Causal::kBottomRight, 100 + seed);
      cfg.dist = Dist::kSpiky;
      RandomProblem prob(cfg);
      const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
      create_method(spec(left, 0, 4))->run(prob.problem(), ExecContext{2});
      err.push_back(compare_with_reference(prob.problem(), ref).rel_fro_error);
    }
    std::sort(err.begin(), err.end());
    med.push_back(err[2]);
  }
  for (std::size_t k = 1; k < med.size(); ++k) EXPECT_LT(med[k], med[k - 1]) << k;
  EXPECT_LT(med.back(), 1e-5);  // left = 256 ≥ N: exact
  std::printf("sparse.window causal N=256 spiky, median rel_fro_error at left=4/16/64/256: %.3g %.3g %.3g %.3g\n",
              med[0], med[1], med[2], med[3]);
}

// LSE merge: (out, lse) of disjoint key sets merge exactly into attention over their union.
// The band's complement (keys left of the band) through exact.flash with a boolean mask, merged
// with sparse.window's own (out, lse): exact attention.
TEST(SparseWindow, LseMergeWithTheComplementIsExactAttention) {
  const index_t n = 60, L = 9;
  RandomProblem band(config(2, 1, n, n, 16, Causal::kTopLeft, 200));
  RandomProblem rest(config(2, 1, n, n, 16, Causal::kTopLeft, 200));
  std::vector<std::uint8_t> allowed(static_cast<std::size_t>(n * n));
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j) allowed[static_cast<std::size_t>(i * n + j)] = j < i - L && j >= 2;
  rest.set_bool_mask(allowed);
  create_method(spec(L, 0, 2))->run(band.problem(), ExecContext{2});
  create_method("exact.flash")->run(rest.problem(), ExecContext{2});
  const ReferenceRows ref = reference_all(band.problem(), ExecContext{2});
  const AttentionProblem& a = band.problem();
  const AttentionProblem& c = rest.problem();
  double worst = 0;
  std::size_t row = 0;
  for (index_t h = 0; h < 2; ++h)
    for (index_t i = 0; i < n; ++i, ++row) {
      const double la = a.lse(0, h, i, 0), lc = c.lse(0, h, i, 0);
      const double m = std::max(la, lc);
      const double wa = std::exp(la - m), wc = lc == kNegInf ? 0.0 : std::exp(lc - m);
      for (index_t e = 0; e < a.d_v(); ++e) {
        const double o = (wa * a.out(0, h, i, e) + wc * c.out(0, h, i, e)) / (wa + wc);
        worst = std::max(worst, std::abs(o - ref.out[row * static_cast<std::size_t>(a.d_v()) + static_cast<std::size_t>(e)]));
      }
      EXPECT_NEAR(m + std::log(wa + wc), ref.lse[row], 1e-5);
    }
  EXPECT_LT(worst, 1e-5);
}

// Causal rows never read future keys: poison every key after row i's diagonal (k and v huge
// but finite) and rows 0..i are unchanged, bitwise.
TEST(SparseWindow, CausalRowsNeverReadFutureKeys) {
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight})
    for (const std::string s : {spec(5, 3, 2), spec(300, 300, 4), spec(0, 0, 0)}) {
      const ProblemConfig cfg = config(4, 2, 70, 90, 16, c, 300);
      for (index_t i : {0, 13, 40, 69}) {
        RandomProblem bad(cfg);
        test::expect_rows_ignore_future_keys(s, bad, i, test::KeyPoison::kSetTo1e30);
      }
    }
}

TEST(SparseWindow, KvCacheDecodeEqualsPrefillAndReadsOnlyTheVisibleSpan) {
  const test::TinyTensors T = test::make_tiny(false);
  const LlamaModel m = LlamaModel::load(test::write_gguf(T, "tiny_window.gguf"), ExecContext{2});
  const auto toks = test::decode_tokens(40, 11);
  for (const std::string s : {spec(6, 0, 2), spec(9, 0, 0), spec(64, 0, 4)}) {
    const test::DecodeRun r = test::prefill_vs_decode(m, s, toks, 9);
    EXPECT_LT(test::max_abs_diff(r.prefill, r.decode), 1e-4) << s;
  }
  // The band does change the model (else the checks above prove nothing).
  const test::DecodeRun w = test::prefill_vs_decode(m, spec(6, 0, 2), toks, 39);
  const test::DecodeRun e = test::prefill_vs_decode(m, "exact.flash", toks, 39);
  EXPECT_GT(test::max_abs_diff(w.prefill, e.prefill), 1e-3);

  // Decode one more token after NaN has been written to every cache slot the step must not read
  // (positions [sinks, P − left) of every layer): the logits stay finite and unchanged.
  const index_t left = 6, sinks = 2;
  ForwardOptions o;
  o.attention = make_attention_methods(spec(left, 0, sinks), m.hparams().n_layer);
  ExecContext ctx{1};
  const std::int64_t P = 39, H = m.hparams().n_head_kv, D = m.hparams().head_dim;
  auto run = [&](bool poison) {
    KvCache c = m.make_cache(40);
    m.forward(std::vector<std::int32_t>(toks.begin(), toks.begin() + P), c, ctx, o);
    if (poison)
      for (int l = 0; l < m.hparams().n_layer; ++l)
        for (std::int64_t pos = sinks; pos < P - left; ++pos)
          for (std::int64_t x = 0; x < H * D; ++x)
            c.k(l)[pos * H * D + x] = c.v(l)[pos * H * D + x] = std::numeric_limits<float>::quiet_NaN();
    return m.forward({toks[P]}, c, ctx, o);
  };
  const std::vector<float> clean = run(false), poisoned = run(true);
  ASSERT_EQ(clean.size(), poisoned.size());
  for (std::size_t v = 0; v < clean.size(); ++v) ASSERT_EQ(clean[v], poisoned[v]) << v;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
