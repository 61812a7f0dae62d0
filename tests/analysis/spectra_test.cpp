// analysis/spectra.h and predict.h against matrices whose answers are known by hand: spectra
// with chosen singular values, one-hot and uniform P, a planted attention sink, and the
// predicted lower bounds against the error each method reaches.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "numattn/analysis/predict.h"
#include "numattn/analysis/spectra.h"
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
