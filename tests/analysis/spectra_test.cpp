// analysis/spectra.h and predict.h against matrices whose answers are known by hand: spectra
// with chosen singular values, one-hot and uniform P, a planted attention sink, and the
// predicted lower bounds against the error each method reaches; the same under a sliding window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "numattn/analysis/predict.h"
#include "numattn/analysis/spectra.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn::analysis {
namespace {
namespace NUMATTN_UNITY_ID {

// Tolerances (docs/numerics.md, "Analysis"): float64 identities to 1e-12 relative; LAPACK's
// singular values to 1e-12·σ₁; bounds vs methods run in float32 to 1e-5.
constexpr double kExact = 1e-12;
constexpr double kF32 = 1e-5;

Matrix randn(std::int64_t r, std::int64_t c, std::uint64_t stream, double scale = 1.0) {
  std::vector<float> v(static_cast<std::size_t>(r * c));
  fill_normal(v, test::base_seed(), stream);
  Matrix m(r, c);
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j) m(i, j) = scale * v[static_cast<std::size_t>(i * c + j)];
  return m;
}

Matrix orthonormal(std::int64_t n, std::int64_t k, std::uint64_t stream) {
  return decomp::dense::qr(randn(n, k, stream)).q;
}

TEST(Spectra, RanksOfAHandWrittenSpectrum) {
  Vector s(5);
  s << 4, 2, 1, 0.01, 0;
  EXPECT_EQ(numerical_rank(s, 1e-2), 3);      // 0.01 is not above 0.04
  EXPECT_EQ(numerical_rank(s, 1e-3), 4);
  EXPECT_EQ(energy_rank(s, 0.9), 2);          // 16 < 0.9·21.0001 ≤ 20
  EXPECT_EQ(energy_rank(s, 0.7), 1);
  EXPECT_EQ(energy_rank(s, 1.0), 4);          // the zero adds nothing
  EXPECT_NEAR(stable_rank(s), 21.0001 / 16, kExact);
  EXPECT_NEAR(tail_rel_fro(s, 1), std::sqrt(5.0001 / 21.0001), kExact);
  EXPECT_EQ(tail_rel_fro(s, 5), 0);
  EXPECT_EQ(tail_rel_fro(s, 0), 1);
  const SpectrumStats st = spectrum_stats(s);
  EXPECT_EQ(st.n, 5);
  EXPECT_EQ(st.sigma1, 4);
  EXPECT_EQ(st.rank_rel, 3);
  EXPECT_EQ(st.rank_energy, 2);
  const Vector zero = Vector::Zero(3);
  EXPECT_EQ(numerical_rank(zero, 1e-2), 0);
  EXPECT_EQ(energy_rank(zero, 0.9), 0);
  EXPECT_EQ(stable_rank(zero), 0);
  EXPECT_THROW(energy_rank(s, 0), Error);
}

TEST(Spectra, AMatrixWithKnownSingularValues) {
  // M = U·diag(σ)·Vᵀ, 30×12 with rank 4.
  Vector sigma = Vector::Zero(12);
  sigma.head(4) << 10, 5, 0.5, 0.05;
  const Matrix m = orthonormal(30, 12, 1) * sigma.asDiagonal() * orthonormal(12, 12, 2).transpose();
  const Vector s = singular_values(m, "M");
  ASSERT_EQ(s.size(), 12);
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(s[i], sigma[i], kExact * 10) << i;
  EXPECT_EQ(numerical_rank(s, 1e-2), 3);  // 0.05 ≤ 0.1
  EXPECT_EQ(numerical_rank(s, 1e-10), 4);
  EXPECT_NEAR(stable_rank(s), (100 + 25 + 0.25 + 0.0025) / 100, kExact);
  Matrix bad = m;
  bad(3, 3) = std::nan("");
  EXPECT_THROW(singular_values(bad, "M"), Error);
}

TEST(Spectra, OneHotP) {
  // S = 200·I (scale 1): every causal row puts all its mass on the diagonal (e^-200 elsewhere).
  const std::int64_t n = 12;
  const Matrix q = 200 * Matrix::Identity(n, n), k = Matrix::Identity(n, n);
  const HeadMatrices h = head_matrices(q, k, 1.0, Causal::kBottomRight);
  EXPECT_TRUE(h.p.isApprox(Matrix::Identity(n, n), 1e-80));
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(h.a(i, i), 1.0);  // row max shifted to 0
  EXPECT_EQ(h.a(0, 1), 0.0);                                        // causal
  const Vector e = row_entropy(h.p);
  EXPECT_LT(e.maxCoeff(), 1e-80);
  const auto vis = visible_keys(n, n, Causal::kBottomRight);
  EXPECT_NEAR(topk_mass(h.p, fixed_k(vis, 1)).minCoeff(), 1.0, kExact);
  EXPECT_TRUE(sink_columns(h.p, vis).empty());
  const SpectrumStats st = spectrum_stats(singular_values(h.p, "P"));
  EXPECT_EQ(st.rank_rel, n);
  EXPECT_NEAR(st.stable_rank, n, 1e-9);
}

TEST(Spectra, UniformP) {
  // Q = 0: every row is uniform over the keys it sees.
  const std::int64_t n = 12;
  const Matrix q = Matrix::Zero(n, 4), k = randn(n, 4, 3);
  const HeadMatrices c = head_matrices(q, k, 0.5, Causal::kBottomRight);
  const auto vis = visible_keys(n, n, Causal::kBottomRight);
  const Vector e = row_entropy(c.p);
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(c.p(i, 0), 1.0 / static_cast<double>(i + 1), kExact);
    EXPECT_NEAR(e[i], std::log(static_cast<double>(i + 1)), kExact) << i;
  }
  const Vector m3 = topk_mass(c.p, fixed_k(vis, 3));
  for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(m3[i], std::min<double>(3, i + 1) / (i + 1), kExact);
  // Causal rows favour early keys, c_0 = H_12/12 = 0.259, yet no key beats 4× the uniform share.
  EXPECT_NEAR(key_share(c.p)[0], 3.103210678210678 / 12, 1e-12);
  EXPECT_TRUE(key_share(c.p).isApprox(uniform_key_share(vis, n), kExact));
  EXPECT_TRUE(sink_columns(c.p, vis).empty());
  // Without a mask P = 11ᵀ/n: rank one, stable rank 1, entropy ln n, top-10% mass 0.1·ceil.
  const HeadMatrices u = head_matrices(q, k, 0.5, Causal::kNone);
  const Vector s = singular_values(u.p, "P");
  EXPECT_NEAR(s[0], 1.0, kExact);
  EXPECT_EQ(numerical_rank(s, 1e-10), 1);
  EXPECT_NEAR(stable_rank(s), 1.0, kExact);
  EXPECT_NEAR(row_entropy(u.p).mean(), std::log(12.0), kExact);
  EXPECT_NEAR(topk_mass(u.p, fraction_k(visible_keys(n, n, Causal::kNone), 0.1)).mean(), 2.0 / 12, kExact);
}

TEST(Spectra, APlantedSinkIsFound) {
  // Key 0 aligns with every query: most attention lands on it.
  const std::int64_t n = 40, d = 8;
  Matrix q = randn(n, d, 4, 0.3), k = randn(n, d, 5, 0.3);
  q.col(0).array() += 6.0;
  k.row(0).setZero();
  k(0, 0) = 6.0;
  const HeadMatrices h = head_matrices(q, k, 1.0 / std::sqrt(d), Causal::kBottomRight);
  const auto vis = visible_keys(n, n, Causal::kBottomRight);
  EXPECT_EQ(sink_columns(h.p, vis), std::vector<std::int64_t>{0});
  EXPECT_GT(key_share(h.p)[0], 0.5);
  EXPECT_NEAR(key_share(h.p).sum(), 1.0, kExact);
}

TEST(Spectra, HugeLogitsStayFiniteAndTheScalingsAgree) {
  const std::int64_t n = 30, d = 6;
  const Matrix q = randn(n, d, 6, 100), k = randn(n, d, 7, 100);  // logits of order 1e4
  const HeadMatrices h = head_matrices(q, k, 1.0, Causal::kBottomRight);
  EXPECT_TRUE(h.a.allFinite() && h.p.allFinite());
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(h.p.row(i).sum(), 1.0, kExact);
    EXPECT_NEAR(h.a.row(i).head(i + 1).maxCoeff(), 1.0, 0);
  }
  // Moderate logits: exp(S − max S) is exp(S) up to one scalar, and normalising its rows gives P.
  const Matrix q2 = randn(n, d, 8), k2 = randn(n, d, 9);
  const HeadMatrices m = head_matrices(q2, k2, 0.4, Causal::kBottomRight);
  const Matrix g = global_shift_a(m.s, Causal::kBottomRight);
  Matrix e = Matrix::Zero(n, n);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j <= i; ++j) e(i, j) = std::exp(m.s(i, j));
  const double c = e(0, 0) / g(0, 0);
  EXPECT_TRUE((c * g).isApprox(e, kExact));
  for (std::int64_t i = 0; i < n; ++i) EXPECT_TRUE((g.row(i) / g.row(i).sum()).isApprox(m.p.row(i), kExact));
  // The decay of A's σ_k/σ_1 is that of exp(S) exactly.
  const Vector se = singular_values(e, "exp(S)"), sg = singular_values(g, "A");
  for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(se[i] / se[0], sg[i] / sg[0], 1e-12);
  EXPECT_THROW(head_matrices(q2, k2.leftCols(3), 1.0, Causal::kNone), Error);
  EXPECT_THROW(head_matrices(q2, k2, -1.0, Causal::kNone), Error);
}

TEST(Spectra, Panels) {
  Matrix p(3, 3);
  p << 1, 0, 0, 0.25, 0.75, 0, 0.2, 0.3, 0.5;
  Matrix want(3, 3);
  want << 1, 0, 0, 1.0 / 3, 1, 0, 0.4, 0.6, 1;
  EXPECT_TRUE(top_left_panel(p, 20).isApprox(want, kExact));
  EXPECT_EQ(top_left_panel(Matrix::Identity(30, 30), 20).rows(), 20);
  Matrix big = Matrix::Zero(40, 40);
  big.topLeftCorner(2, 2).setConstant(1.0);  // exactly block (0, 0) of a 20×20 grid
  big(39, 39) = 8;
  const Matrix g = block_panel(big, 20);
  EXPECT_EQ(g(0, 0), 1.0);
  EXPECT_EQ(g(19, 19), 2.0);
  EXPECT_EQ(g.sum(), 3.0);
  EXPECT_THROW(block_panel(p, 20), Error);
  EXPECT_NEAR(topk_mass(p, {1, 1, 2}).sum(), 1 + 0.75 + 0.8, kExact);
}

TEST(Spectra, AnalyzeLayerReadsTheKvHeadOfEachQueryHead) {
  LayerQkv l;
  l.heads = 4, l.kv_heads = 2, l.n = 24, l.d = 8;
  auto fill = [&](std::int64_t h, std::uint64_t stream) {
    const Matrix m = randn(h * l.n, l.d, stream);
    std::vector<double> v(static_cast<std::size_t>(m.size()));
    for (std::int64_t i = 0; i < m.rows(); ++i)
      for (std::int64_t c = 0; c < l.d; ++c) v[static_cast<std::size_t>(i * l.d + c)] = m(i, c);
    return v;
  };
  l.q_post = fill(4, 10), l.k_post = fill(2, 11), l.v = fill(2, 12), l.q_pre = fill(4, 13), l.k_pre = fill(2, 14);
  const double scale = 1 / std::sqrt(8.0);
  const LayerAnalysis a = analyze_layer(l, scale, {}, ExecContext{2});
  EXPECT_EQ(a.spectra.size(), 4u * 6 + 2 * 3);
  ASSERT_EQ(a.rows.size(), 4u);
  const Matrix want = head_matrices(head_matrix(l.q_post, 3, 24, 8), head_matrix(l.k_post, 1, 24, 8), scale,
                                    Causal::kBottomRight).p;
  bool found = false;
  for (const HeadSpectrum& s : a.spectra) {
    if (std::string(s.matrix) == "qk") {
      EXPECT_LE(numerical_rank(s.sigma, 1e-10), 8);
    }
    if (std::string(s.matrix) == "p") {
      EXPECT_GE(s.sigma[0], 1 - kExact);  // P·1 = 1
    }
    if (s.head == 3 && std::string(s.matrix) == "p") {
      found = true;
      const Vector w = singular_values(want, "P");
      EXPECT_TRUE(s.sigma.isApprox(w, kExact));
    }
  }
  EXPECT_TRUE(found);
  // One query head: only its KV head is analysed.
  const LayerAnalysis one = analyze_layer(l, scale, {2}, ExecContext{1});
  EXPECT_EQ(one.spectra.size(), 6u + 3);
  EXPECT_THROW(analyze_layer(l, scale, {4}, ExecContext{1}), OptionError);
  l.k_post.pop_back();
  EXPECT_THROW(analyze_layer(l, scale, {}, ExecContext{1}), Error);
}

// ---- sliding windows ----------------------------------------------------------------------

std::vector<float> to_float(const Matrix& m) {
  std::vector<float> v(static_cast<std::size_t>(m.size()));
  for (std::int64_t i = 0; i < m.rows(); ++i)
    for (std::int64_t c = 0; c < m.cols(); ++c) v[static_cast<std::size_t>(i * m.cols() + c)] = static_cast<float>(m(i, c));
  return v;
}

TEST(SpectraWindow, VisibleRangesAreTheProblemsRule) {
  // Against AttentionProblem::key_range with window_left = W − 1, every causal rule and shape.
  for (const Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight})
    for (const auto& [nq, nk] : {std::pair<std::int64_t, std::int64_t>{8, 8}, {5, 9}, {9, 5}, {1, 6}})
      for (const std::int64_t w : {0, 1, 3, 5, 20}) {
        SCOPED_TRACE(testing::Message() << to_string(c) << " " << nq << "x" << nk << " W=" << w);
        std::vector<float> q(static_cast<std::size_t>(nq)), k(static_cast<std::size_t>(nk));
        AttentionProblem p;
        p.q = TensorView<const float>::contiguous(q.data(), {1, 1, nq, 1});
        p.k = TensorView<const float>::contiguous(k.data(), {1, 1, nk, 1});
        p.causal = c;
        if (w > 0) p.window_left = w - 1;
        const auto r = visible_ranges(nq, nk, c, w);
        const auto n = visible_keys(nq, nk, c, w);
        ASSERT_EQ(r.size(), static_cast<std::size_t>(nq));
        for (std::int64_t i = 0; i < nq; ++i) {
          const KeyRange want = p.key_range(i), got = r[static_cast<std::size_t>(i)];
          EXPECT_EQ(got.end - got.begin, want.end - want.begin) << i;
          if (!want.empty()) {
            EXPECT_EQ(got.begin, want.begin) << i;
            EXPECT_EQ(got.end, want.end) << i;
          }
          EXPECT_EQ(n[static_cast<std::size_t>(i)], got.end - got.begin);
        }
      }
  // Without a window, the counts are those of before: the causal prefix.
  EXPECT_EQ(visible_keys(4, 4, Causal::kBottomRight), (std::vector<std::int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(visible_keys(4, 4, Causal::kBottomRight, 2), (std::vector<std::int64_t>{1, 2, 2, 2}));
  EXPECT_THROW(visible_ranges(4, 4, Causal::kBottomRight, -1), Error);
}

TEST(SpectraWindow, PRowsSumToOneOverExactlyTheWindowsKeys) {
  const std::int64_t n = 40, d = 6, w = 7;
  const Matrix q = randn(n, d, 30, 1.5), k = randn(n, d, 31, 1.5), v = randn(n, 3, 32);
  const double scale = 0.4;
  const HeadMatrices h = head_matrices(q, k, scale, Causal::kBottomRight, w);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t lo = std::max<std::int64_t>(0, i - w + 1);
    double sum = 0, amax = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      if (j < lo || j > i) {
        EXPECT_EQ(h.p(i, j), 0.0) << i << "," << j;  // exactly: outside the window
        EXPECT_EQ(h.a(i, j), 0.0) << i << "," << j;
      } else {
        EXPECT_GT(h.p(i, j), 0.0) << i << "," << j;
        sum += h.p(i, j);
        amax = std::max(amax, h.a(i, j));
      }
    }
    EXPECT_NEAR(sum, 1.0, kExact) << i;
    EXPECT_EQ(amax, 1.0) << i;  // the row's maximum over the window is shifted to 0
    // P_i is the softmax of S_i over keys lo..i, computed directly.
    double z = 0;
    for (std::int64_t j = lo; j <= i; ++j) z += std::exp(h.s(i, j));
    for (std::int64_t j = lo; j <= i; ++j) EXPECT_NEAR(h.p(i, j), std::exp(h.s(i, j)) / z, kExact) << i << "," << j;
  }
  // P·V is the float64 reference of the problem with window_left = W − 1 (problem.h).
  const std::vector<float> qf = to_float(q), kf = to_float(k), vf = to_float(v);
  std::vector<float> out(static_cast<std::size_t>(n * 3));
  AttentionProblem p;
  p.q = TensorView<const float>::contiguous(qf.data(), {1, 1, n, d});
  p.k = TensorView<const float>::contiguous(kf.data(), {1, 1, n, d});
  p.v = TensorView<const float>::contiguous(vf.data(), {1, 1, n, 3});
  p.out = TensorView<float>::contiguous(out.data(), {1, 1, n, 3});
  p.scale = scale;
  p.causal = Causal::kBottomRight;
  p.window_left = w - 1;
  const ReferenceRows ref = reference_all(p, ExecContext{1});
  Matrix qq(n, d), kk(n, d), vv(n, 3);  // the float32 values, widened
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t c = 0; c < d; ++c) qq(i, c) = qf[static_cast<std::size_t>(i * d + c)], kk(i, c) = kf[static_cast<std::size_t>(i * d + c)];
    for (std::int64_t c = 0; c < 3; ++c) vv(i, c) = vf[static_cast<std::size_t>(i * 3 + c)];
  }
  const Matrix pv = head_matrices(qq, kk, scale, Causal::kBottomRight, w).p * vv;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t c = 0; c < 3; ++c)
      EXPECT_NEAR(pv(i, c), ref.out[static_cast<std::size_t>(i * 3 + c)], 1e-12 * (1 + std::abs(pv(i, c)))) << i;
  // exp(S − max S)⊙M: zero outside the window, exp(S) up to one scalar inside.
  const Matrix g = global_shift_a(h.s, Causal::kBottomRight, w);
  const double c0 = std::exp(h.s(0, 0)) / g(0, 0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      if (j < std::max<std::int64_t>(0, i - w + 1) || j > i) EXPECT_EQ(g(i, j), 0.0);
      else EXPECT_NEAR(c0 * g(i, j), std::exp(h.s(i, j)), kExact * std::exp(h.s(i, j)));
    }
  // A window of at least N keys hides nothing: the matrices of no window, bit for bit.
  const HeadMatrices full = head_matrices(q, k, scale, Causal::kBottomRight, n);
  const HeadMatrices none = head_matrices(q, k, scale, Causal::kBottomRight);
  EXPECT_EQ(full.p, none.p);
  EXPECT_EQ(full.a, none.a);
  EXPECT_EQ(global_shift_a(h.s, Causal::kBottomRight, n), global_shift_a(h.s, Causal::kBottomRight));
  EXPECT_THROW(head_matrices(q, k, scale, Causal::kBottomRight, -1), Error);
}

TEST(SpectraWindow, UniformRowsOverTheWindowHaveNoSink) {
  // Q = 0: every row is uniform over its window's keys.
  const std::int64_t n = 30, w = 5;
  const Matrix q = Matrix::Zero(n, 4), k = randn(n, 4, 33);
  const HeadMatrices h = head_matrices(q, k, 0.5, Causal::kBottomRight, w);
  const auto ranges = visible_ranges(n, n, Causal::kBottomRight, w);
  const auto vis = range_sizes(ranges);
  const Vector e = row_entropy(h.p);
  const Vector m3 = topk_mass(h.p, fixed_k(vis, 3));
  for (std::int64_t i = 0; i < n; ++i) {
    const double seen = static_cast<double>(std::min<std::int64_t>(i + 1, w));
    EXPECT_EQ(vis[static_cast<std::size_t>(i)], std::min<std::int64_t>(i + 1, w));
    EXPECT_NEAR(e[i], std::log(seen), kExact) << i;
    EXPECT_NEAR(m3[i], std::min(3.0, seen) / seen, kExact) << i;
  }
  // The uniform share counts the window's keys: it is the key share of these rows exactly.
  EXPECT_TRUE(key_share(h.p).isApprox(uniform_key_share(ranges, n), kExact));
  EXPECT_TRUE(sink_columns(h.p, ranges).empty());
  // The causal-prefix rule would misjudge it: under it, late keys look over-attended.
  const Vector prefix = uniform_key_share(visible_keys(n, n, Causal::kBottomRight), n);
  EXPECT_GT(key_share(h.p)[n - 1], 4 * prefix[n - 1]);
  // A planted sink inside every window is found: key 0 with a window covering all rows.
  Matrix qs = randn(n, 4, 34, 0.3), ks = randn(n, 4, 35, 0.3);
  qs.col(0).array() += 6.0;
  ks.row(0).setZero();
  ks(0, 0) = 6.0;
  const auto all = visible_ranges(n, n, Causal::kBottomRight, n);
  EXPECT_EQ(sink_columns(head_matrices(qs, ks, 0.5, Causal::kBottomRight, n).p, all), std::vector<std::int64_t>{0});
  // With a window of 5 keys, key 0 is seen by rows 0..4 only: at most 5/30 of the attention.
  EXPECT_LE(key_share(head_matrices(qs, ks, 0.5, Causal::kBottomRight, w).p)[0], 5.0 / 30 + kExact);
}

TEST(SpectraWindow, AnalyzeLayerHonoursTheLayersWindow) {
  LayerQkv l;
  l.heads = 2, l.kv_heads = 1, l.n = 24, l.d = 8, l.window = 5;
  auto fill = [&](std::int64_t h, std::uint64_t stream) {
    const Matrix m = randn(h * l.n, l.d, stream);
    std::vector<double> v(static_cast<std::size_t>(m.size()));
    for (std::int64_t i = 0; i < m.rows(); ++i)
      for (std::int64_t c = 0; c < l.d; ++c) v[static_cast<std::size_t>(i * l.d + c)] = m(i, c);
    return v;
  };
  l.q_post = fill(2, 40), l.k_post = fill(1, 41), l.v = fill(1, 42);
  const double scale = 0.5;
  const LayerAnalysis a = analyze_layer(l, scale, {}, ExecContext{2});
  EXPECT_EQ(a.window, 5);
  const Matrix q1 = head_matrix(l.q_post, 1, 24, 8), k0 = head_matrix(l.k_post, 0, 24, 8);
  const HeadMatrices hw = head_matrices(q1, k0, scale, Causal::kBottomRight, 5);
  const Vector want_p = singular_values(hw.p, "P");
  const Vector want_g = singular_values(global_shift_a(hw.s, Causal::kBottomRight, 5), "A");
  const Vector causal_p = singular_values(head_matrices(q1, k0, scale, Causal::kBottomRight).p, "P");
  int checked = 0;
  for (const HeadSpectrum& s : a.spectra) {
    if (s.head != 1) continue;
    if (std::string(s.matrix) == "p") {
      EXPECT_TRUE(s.sigma.isApprox(want_p, kExact));
      EXPECT_FALSE(s.sigma.isApprox(causal_p, 1e-6));  // the window changed P
      ++checked;
    }
    if (std::string(s.matrix) == "a_exp") {
      EXPECT_TRUE(s.sigma.isApprox(want_g, kExact));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);
  for (const HeadRows& r : a.rows) {
    EXPECT_LE(r.entropy_max, std::log(5.0) + kExact);
    EXPECT_NEAR(r.topk_mass_k8, 1.0, kExact);  // 8 keys ≥ the window's 5
  }
  // The §9 findings count the windowed heads.
  const auto f = section9_findings({a}, l.n, l.d);
  EXPECT_EQ(f[1]["evidence"]["heads_windowed"], 2);
  EXPECT_EQ(f[2]["evidence"]["heads_windowed"], 2);
  l.window = 0;
  EXPECT_FALSE(section9_findings({analyze_layer(l, scale, {}, ExecContext{1})}, l.n, l.d)[1]["evidence"].contains(
      "heads_windowed"));
  l.window = -1;
  EXPECT_THROW(analyze_layer(l, scale, {}, ExecContext{1}), Error);
}

TEST(PredictWindow, BoundsUseTheWindowedPAndMethodsThatCannotRunAreSkipped) {
  const std::int64_t n = 48, d = 8, w = 6;
  const Matrix q = randn(n, d, 50, 1.5), k = randn(n, d, 51, 1.5), v = randn(n, 5, 52);
  const double scale = 1 / std::sqrt(8.0);
  const std::vector<std::string> specs = {"lowrank.svd(rank=4)",          "lowrank.nystrom(landmarks=8)",
                                          "sparse.topk(k=4)",             "lowrank.loki(topk_frac=0.25)",
                                          "sparse.window(left=2,sinks=2)", "sparse.window(left=10,sinks=2)"};
  const auto rows = predict_head(q, k, v, scale, specs, ExecContext{1}, w);
  ASSERT_EQ(rows.size(), specs.size());
  const Matrix pw = head_matrices(q, k, scale, Causal::kBottomRight, w).p;
  const auto vis = visible_keys(n, n, Causal::kBottomRight, w);
  for (const PredictRow& r : rows) {
    SCOPED_TRACE(r.method);
    if (r.method.rfind("lowrank.nystrom", 0) == 0 || r.method.rfind("lowrank.svd", 0) == 0) {
      // Windowless: the causal recursion runs them, whose blocks, not the layer's P, set their
      // error, so there is no prediction to check.
      EXPECT_NE(r.skipped.find("window"), std::string::npos) << r.skipped;
      EXPECT_TRUE(std::isnan(r.predicted) && std::isnan(r.measured));
      continue;
    }
    EXPECT_TRUE(r.skipped.empty()) << r.skipped;
    EXPECT_EQ(r.window, w);
    EXPECT_STREQ(r.causal, "bottom-right");
    EXPECT_LE(r.budget_excess, 0);
    EXPECT_GE(r.measured, r.predicted - kF32);
    EXPECT_TRUE(std::isfinite(r.output_rel_fro));
  }
  // The bounds are those of the windowed P.
  EXPECT_NEAR(rows[2].predicted, (1.0 - topk_mass(pw, fixed_k(vis, 4)).array()).mean(), kExact);
  EXPECT_NEAR(rows[2].measured, 2 * rows[2].predicted, kF32);
  // sparse.window inside the layer's window: band 3 keys plus the sinks still in the window.
  const Budget b = method_budget(*create_method("sparse.window(left=2,sinks=2)"), n, n, w);
  EXPECT_EQ(b.window, w);
  EXPECT_EQ(b.keys_per_row[0], 1);
  EXPECT_EQ(b.keys_per_row[3], 4);   // window 0..3: band 1..3 and sink 0
  EXPECT_EQ(b.keys_per_row[6], 4);   // window 1..6: band 4..6 and sink 1
  EXPECT_EQ(b.keys_per_row[10], 3);  // window 5..10: the sinks are outside it
  EXPECT_GT(rows[4].predicted, 0);
  // A band wider than the window keeps every key the layer sees: exact, bound 0.
  EXPECT_NEAR(rows[5].predicted, 0, kExact);
  EXPECT_NEAR(rows[5].measured, 0, kF32);
  // A window of at least Nk keys is none: the rows of an unwindowed head, Nyström included.
  const auto wide = predict_head(q, k, v, scale, specs, ExecContext{1}, n);
  const auto plain = predict_head(q, k, v, scale, specs, ExecContext{1});
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(wide[i].skipped.empty());
    EXPECT_EQ(wide[i].window, 0);
    EXPECT_EQ(wide[i].predicted, plain[i].predicted) << specs[i];
    EXPECT_EQ(wide[i].measured, plain[i].measured) << specs[i];
  }
  EXPECT_THROW(predict_head(q, k, v, scale, specs, ExecContext{1}, -1), Error);
}

TEST(Predict, MeasuredErrorsRespectTheLowerBounds) {
  const std::int64_t n = 48, d = 8;
  const Matrix q = randn(n, d, 20, 1.5), k = randn(n, d, 21, 1.5), v = randn(n, 5, 22);
  const std::vector<std::string> specs = {"lowrank.svd(rank=4)", "lowrank.svd(rank=16)", "lowrank.nystrom(landmarks=8)",
                                          "sparse.topk(k=4)", "lowrank.loki(topk_frac=0.25)",
                                          "sparse.window(left=6,sinks=2)"};
  const auto rows = predict_head(q, k, v, 1 / std::sqrt(8.0), specs, ExecContext{1});
  ASSERT_EQ(rows.size(), specs.size());
  for (const PredictRow& r : rows) {
    SCOPED_TRACE(r.method);
    EXPECT_GT(r.predicted, 0);
    EXPECT_LE(r.budget_excess, 0);
    EXPECT_GE(r.measured, r.predicted - kF32);
    EXPECT_TRUE(std::isfinite(r.output_rel_fro));
  }
  // The oracles attain their bounds: truncated SVD equals the tail, top-k with renormalisation
  // loses the dropped mass twice (once outside, once spread over the kept keys).
  EXPECT_NEAR(rows[0].measured, rows[0].predicted, kF32);
  EXPECT_NEAR(rows[1].measured, rows[1].predicted, kF32);
  EXPECT_LT(rows[1].predicted, rows[0].predicted);
  EXPECT_NEAR(rows[3].measured, 2 * rows[3].predicted, kF32);
  EXPECT_STREQ(rows[2].causal, "none");
  EXPECT_STREQ(rows[0].metric, "rel_fro_P");
  EXPECT_STREQ(rows[3].metric, "mean_row_l1_P");
  EXPECT_EQ(rows[5].param, "left=6,sinks=2");
  EXPECT_THROW(predict_head(q, k, v, 0.3, {"exact.flash"}, ExecContext{1}), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::analysis
