// GQA -> MLA conversion (transform/mla.h) in float64: the exact merge equals GQA attention
// (identity 6), RoRoPE leaves scores unchanged (identity 5), FreqFold's Ky Fan bound
// (identity 8), the balanced PCA is exact at full rank and its error falls with the rank,
// bad options are refused by name. The attention of both forms is written here from the
// formulas of model/llama.h and arch/mla_weights.h, apart from the model code. Tolerances:
// docs/numerics.md, "GQA → MLA conversion".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/transform/mla.h"
#include "support/test_util.h"

namespace numattn::transform {
namespace {
namespace NUMATTN_UNITY_ID {

using Vec = std::vector<double>;

struct Layer {
  ModelHParams hp;
  Vec wq, wk, wv;
  Vec mix;  // [E, E]: calibration tokens are xn = mix·z, z ~ N(0, I)
  MlaCalibration calib;
};

ModelHParams hparams(std::int64_t e, std::int64_t hq, std::int64_t hkv, std::int64_t d,
                     std::int64_t n_rot) {
  ModelHParams hp;
  hp.n_vocab = 16;
  hp.n_embd = e;
  hp.n_layer = 1;
  hp.n_ff = 2 * e;
  hp.n_head = hq;
  hp.n_head_kv = hkv;
  hp.head_dim = d;
  hp.n_rot = n_rot;
  hp.rope_base = 10000.0;
  hp.n_ctx_train = 1 << 20;
  return hp;
}

Vec normal(std::size_t n, std::uint64_t seed, std::uint64_t stream) {
  Vec v(n);
  fill_normal(std::span<double>(v), seed, stream);
  return v;
}

/// out[N, rows] = x[N, E] · wᵀ (w [rows, E] row-major).
Vec project(const Vec& x, std::int64_t n, const Vec& w, std::int64_t rows, std::int64_t e) {
  Vec out(static_cast<std::size_t>(n * rows), 0.0);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::int64_t c = 0; c < e; ++c) s += x[t * e + c] * w[r * e + c];
      out[t * rows + r] = s;
    }
  return out;
}

/// A random layer whose KV heads and input directions carry unequal energy (so RoRoPE and the
/// PCA have something to find), with the calibration covariance of T samples of xn = mix·z.
Layer make_layer(std::int64_t e, std::int64_t hq, std::int64_t hkv, std::int64_t d, std::int64_t n_rot,
                 std::uint64_t seed) {
  Layer L;
  L.hp = hparams(e, hq, hkv, d, n_rot);
  L.wq = normal(static_cast<std::size_t>(hq * d * e), seed, 1);
  L.wk = normal(static_cast<std::size_t>(hkv * d * e), seed, 2);
  L.wv = normal(static_cast<std::size_t>(hkv * d * e), seed, 3);
  for (std::int64_t r = 0; r < hkv * d; ++r)
    for (std::int64_t c = 0; c < e; ++c) {
      L.wk[r * e + c] *= 0.3 * (1.0 + 2.0 * static_cast<double>(r / d)) / std::sqrt(static_cast<double>(e));
      L.wv[r * e + c] *= 0.1 / std::sqrt(static_cast<double>(e));
    }
  for (double& x : L.wq) x *= 0.3 / std::sqrt(static_cast<double>(e));
  L.mix = normal(static_cast<std::size_t>(e * e), seed, 4);
  for (std::int64_t c = 0; c < e; ++c)
    for (std::int64_t r = 0; r < e; ++r) L.mix[r * e + c] *= std::pow(0.9, static_cast<double>(c));
  const std::int64_t t = 4 * e;
  const Vec xn = project(normal(static_cast<std::size_t>(t * e), seed, 5), t, L.mix, e, e);
  L.calib.xn_cov.assign(static_cast<std::size_t>(e * e), 0.0);
  for (std::int64_t s = 0; s < t; ++s)
    for (std::int64_t i = 0; i < e; ++i)
      for (std::int64_t j = 0; j < e; ++j) L.calib.xn_cov[i * e + j] += xn[s * e + i] * xn[s * e + j] / t;
  L.calib.tokens = t;
  return L;
}

/// N fresh tokens from the calibration distribution.
Vec tokens(const Layer& L, std::int64_t n, std::uint64_t seed) {
  const std::int64_t e = L.hp.n_embd;
  return project(normal(static_cast<std::size_t>(n * e), seed, 9), n, L.mix, e, e);
}

/// Rotates adjacent pairs of each `width`-wide block of every row (first 2·theta.size() dims).
void rope(Vec& x, std::int64_t n, std::int64_t blocks, std::int64_t width, const Vec& theta,
          std::int64_t pos0) {
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t b = 0; b < blocks; ++b)
      for (std::size_t i = 0; i < theta.size(); ++i) {
        const double a = static_cast<double>(pos0 + t) * theta[i];
        double* p = &x[(t * blocks + b) * width + 2 * static_cast<std::int64_t>(i)];
        const double x0 = p[0], y0 = p[1];
        p[0] = x0 * std::cos(a) - y0 * std::sin(a);
        p[1] = x0 * std::sin(a) + y0 * std::cos(a);
      }
}

struct Attn {
  Vec scores;  // [Hq, N, N] scaled, causal (j <= i; the rest 0)
  Vec out;     // [N, Hq·d_v]
};

/// Causal softmax attention given per-head scaled scores and per-head values v(h) [N, dv].
void finish(Attn& a, std::int64_t n, std::int64_t hq, std::int64_t dv,
            const std::function<double(std::int64_t, std::int64_t, std::int64_t)>& value) {
  a.out.assign(static_cast<std::size_t>(n * hq * dv), 0.0);
  for (std::int64_t h = 0; h < hq; ++h)
    for (std::int64_t i = 0; i < n; ++i) {
      const double* s = &a.scores[(h * n + i) * n];
      const double mx = *std::max_element(s, s + i + 1);
      double z = 0;
      for (std::int64_t j = 0; j <= i; ++j) z += std::exp(s[j] - mx);
      for (std::int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(s[j] - mx) / z;
        for (std::int64_t c = 0; c < dv; ++c) a.out[(i * hq + h) * dv + c] += p * value(h, j, c);
      }
    }
}

/// GQA attention of model/llama.h in float64 (θ_i of the model unless `theta` is given).
Attn gqa(const Layer& L, const Vec& xn, std::int64_t n, std::int64_t pos0, Vec theta = {}) {
  const ModelHParams& hp = L.hp;
  const std::int64_t e = hp.n_embd, hq = hp.n_head, hkv = hp.n_head_kv, d = hp.head_dim;
  if (theta.empty())
    for (std::int64_t i = 0; i < hp.n_rot / 2; ++i)
      theta.push_back(std::pow(hp.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(hp.n_rot)));
  Vec q = project(xn, n, L.wq, hq * d, e), k = project(xn, n, L.wk, hkv * d, e);
  const Vec v = project(xn, n, L.wv, hkv * d, e);
  rope(q, n, hq, d, theta, pos0);
  rope(k, n, hkv, d, theta, pos0);
  Attn a;
  a.scores.assign(static_cast<std::size_t>(hq * n * n), 0.0);
  const std::int64_t group = hq / hkv;
  for (std::int64_t h = 0; h < hq; ++h)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (std::int64_t c = 0; c < d; ++c) s += q[(i * hq + h) * d + c] * k[(j * hkv + h / group) * d + c];
        a.scores[(h * n + i) * n + j] = s / std::sqrt(static_cast<double>(d));
      }
  finish(a, n, hq, d, [&](std::int64_t h, std::int64_t j, std::int64_t c) {
    return v[(j * hkv + h / group) * d + c];
  });
  return a;
}

/// MLA attention of arch/mla_weights.h in float64 (naive: up-projected keys and values).
Attn mla(const MlaLayerWeights& w, std::int64_t e, const Vec& xn, std::int64_t n, std::int64_t pos0) {
  const std::int64_t hq = w.n_head, r = w.rank, dn = w.d_nope, dr = w.d_rope, dv = w.d_v;
  const Vec c = project(xn, n, w.w_dkv, r, e);
  Vec kr = project(xn, n, w.w_kr, dr, e), qr = project(xn, n, w.w_q_rope, hq * dr, e);
  const Vec qn = project(xn, n, w.w_q_nope, hq * dn, e);
  const Vec kn = project(c, n, w.w_uk, hq * dn, r), v = project(c, n, w.w_uv, hq * dv, r);
  rope(kr, n, 1, dr, w.rope_theta, pos0);
  rope(qr, n, hq, dr, w.rope_theta, pos0);
  Attn a;
  a.scores.assign(static_cast<std::size_t>(hq * n * n), 0.0);
  for (std::int64_t h = 0; h < hq; ++h)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (std::int64_t t = 0; t < dn; ++t) s += qn[(i * hq + h) * dn + t] * kn[(j * hq + h) * dn + t];
        for (std::int64_t t = 0; t < dr; ++t) s += qr[(i * hq + h) * dr + t] * kr[j * dr + t];
        a.scores[(h * n + i) * n + j] = w.softmax_scale * s;
      }
  finish(a, n, hq, dv, [&](std::int64_t h, std::int64_t j, std::int64_t t) { return v[(j * hq + h) * dv + t]; });
  return a;
}

/// max |a − b| / max |b|.
double rel_err(const Vec& a, const Vec& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

// Tolerances (docs/numerics.md): exact rewrites agree to 1e-12 (merge) and 1e-10 (RoRoPE, PCA at
// full rank: an orthogonal change of basis computed by an eigensolver) relative to max |score|.
constexpr double kMergeTol = 1e-12;
constexpr double kRewriteTol = 1e-10;
constexpr std::int64_t kPositions[] = {0, 1000, 123457};

struct Shape {
  std::int64_t e, hq, hkv, d, n_rot;
  const char* name;
};
constexpr Shape kShapes[] = {{48, 6, 2, 8, 8, "GQA 6/2"},
                             {40, 4, 4, 8, 4, "MHA, partial rotary"},
                             {32, 4, 1, 8, 8, "MQA"},
                             {56, 6, 3, 12, 8, "GQA 6/3, partial rotary"}};

TEST(MlaConvert, ExactMergeEqualsGqa) {
  for (const Shape& s : kShapes) {
    const Layer L = make_layer(s.e, s.hq, s.hkv, s.d, s.n_rot, test::base_seed());
    MlaOptions opt;
    opt.rope_heads = static_cast<int>(s.hkv);
    const MlaLayerWeights w = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt);
    EXPECT_EQ(w.d_rope, s.hkv * s.n_rot) << s.name;
    EXPECT_EQ(w.d_nope, s.hkv * (s.d - s.n_rot)) << s.name;
    EXPECT_EQ(w.rank, s.hkv * (s.d - s.n_rot) + s.hkv * s.d) << s.name;
    EXPECT_EQ(w.cache_width(), 2 * s.hkv * s.d) << s.name;
    // q_rope of head h lives in its group's block only: n_rot nonzero rows.
    for (std::int64_t h = 0; h < s.hq; ++h) {
      std::int64_t nonzero = 0;
      for (std::int64_t r = 0; r < w.d_rope; ++r)
        for (std::int64_t c = 0; c < s.e; ++c)
          if (w.w_q_rope[(h * w.d_rope + r) * s.e + c] != 0) {
            ++nonzero;
            break;
          }
      EXPECT_EQ(nonzero, s.n_rot) << s.name << " head " << h;
    }
    const Vec xn = tokens(L, 12, test::base_seed() + 1);
    for (std::int64_t p : kPositions) {
      const Attn ref = gqa(L, xn, 12, p), got = mla(w, s.e, xn, 12, p);
      EXPECT_LE(rel_err(got.scores, ref.scores), kMergeTol) << s.name << " pos " << p;
      EXPECT_LE(rel_err(got.out, ref.out), kMergeTol) << s.name << " pos " << p;
    }
  }
}

TEST(MlaConvert, RoRopeRewriteLeavesScoresUnchanged) {
  for (const Shape& s : kShapes) {
    const Layer L = make_layer(s.e, s.hq, s.hkv, s.d, s.n_rot, test::base_seed() + 2);
    const RoRopeBasis b = rorope_basis(L.hp, L.wk, L.calib, 1);
    ASSERT_EQ(static_cast<std::int64_t>(b.u.size()), s.n_rot / 2);
    double off = 0;  // the rotation must be a real one, not the identity
    for (const Vec& u : b.u) {
      for (std::int64_t i = 0; i < b.n; ++i)
        for (std::int64_t j = 0; j < b.n; ++j) {
          double dot = 0;
          for (std::int64_t k = 0; k < b.n; ++k) dot += u[k * b.n + i] * u[k * b.n + j];
          EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-12);
          if (i != j) off = std::max(off, std::abs(u[i * b.n + j]));
        }
    }
    if (s.hkv > 1) {
      EXPECT_GT(off, 0.05) << s.name;
    }
    const MlaLayerWeights w = rorope_merge(L.hp, L.wq, L.wk, L.wv, b);
    const Vec xn = tokens(L, 12, test::base_seed() + 3);
    for (std::int64_t p : kPositions) {
      const Attn ref = gqa(L, xn, 12, p), got = mla(w, s.e, xn, 12, p);
      EXPECT_LE(rel_err(got.scores, ref.scores), kRewriteTol) << s.name << " pos " << p;
      EXPECT_LE(rel_err(got.out, ref.out), kRewriteTol) << s.name << " pos " << p;
    }
  }
}

TEST(MlaConvert, FreqFoldKyFanAndFoldedFrequencies) {
  const std::int64_t e = 48, hq = 6, hkv = 3, d = 16, n_rot = 16;
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    const Layer L = make_layer(e, hq, hkv, d, n_rot, test::base_seed() + 10 + seed);
    const RoRopeBasis b1 = rorope_basis(L.hp, L.wk, L.calib, 1);
    for (int m : {2, 4, 8}) {
      const RoRopeBasis bm = rorope_basis(L.hp, L.wk, L.calib, m);
      for (std::int64_t keep = 1; keep <= hkv; ++keep) {
        // Identity 8: V_2 (top keep·M of each folded group) >= V_1 (top keep of each frequency).
        const double v1 = rorope_captured_energy(b1, keep), v2 = rorope_captured_energy(bm, keep * m);
        EXPECT_GE(v2, v1 * (1 - 1e-12)) << "M=" << m << " keep=" << keep;
        if (keep < hkv) {
          EXPECT_GT(v2, v1) << "M=" << m << " keep=" << keep;
        }
      }
      // Every component kept: each rotates at its own member's frequency, so the folded merge
      // is GQA itself (no rotation is needed when nothing is dropped).
      MlaOptions opt;
      opt.rope_heads = static_cast<int>(hkv);
      opt.freqfold = m;
      const MlaLayerWeights wc = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt);
      // With a rotation that mixes members, no per-component frequency is exact.
      const MlaLayerWeights w = rorope_merge(L.hp, L.wq, L.wk, L.wv, bm);
      const Vec xn = tokens(L, 10, seed);
      for (std::int64_t p : kPositions) {
        const Attn ref = gqa(L, xn, 10, p);
        EXPECT_LE(rel_err(mla(wc, e, xn, 10, p).scores, ref.scores), kMergeTol) << "M=" << m << " pos " << p;
        if (p > 0) {
          EXPECT_GT(rel_err(mla(w, e, xn, 10, p).scores, ref.scores), 1e-6) << "M=" << m << " pos " << p;
        }
      }
    }
  }
}

TEST(MlaConvert, PerMemberFrequencies) {
  const ModelHParams hp = hparams(48, 6, 3, 16, 16);  // 8 frequencies, 3 KV heads
  auto theta = [&](std::int64_t i) { return std::pow(hp.rope_base, -2.0 * static_cast<double>(i) / 16.0); };
  // M = 1: every kept pair of frequency i rotates at θ_i, rope_heads of them per frequency.
  for (std::int64_t h = 1; h <= 3; ++h) {
    const Vec th = mla_rope_theta(hp, 1, h * 16);
    ASSERT_EQ(static_cast<std::int64_t>(th.size()), h * 8);
    for (std::int64_t i = 0; i < 8; ++i)
      for (std::int64_t c = 0; c < h; ++c) EXPECT_EQ(th[i * h + c], theta(i)) << "h=" << h;
  }
  // M = 4, one head's worth: group f keeps 4 components at members 0..3, i.e. θ_{4f+m}.
  Vec th = mla_rope_theta(hp, 4, 16);
  for (std::int64_t i = 0; i < 8; ++i) EXPECT_EQ(th[i], theta(i));
  // M = 4, 8 dims (TransMLA's collapse 2): 2 per group at members 0 and 2.
  th = mla_rope_theta(hp, 4, 8);
  ASSERT_EQ(th.size(), 4u);
  EXPECT_EQ(th[0], theta(0));
  EXPECT_EQ(th[1], theta(2));
  EXPECT_EQ(th[2], theta(4));
  EXPECT_EQ(th[3], theta(6));
  // Dims that do not divide evenly: the remainder goes to the first groups, the counts add up.
  for (int m : {1, 2, 4, 8})
    for (std::int64_t dims = 2; dims <= 48; dims += 2) {
      const std::vector<std::int64_t> k = rope_components(hp, m, dims);
      std::int64_t sum = 0;
      for (std::size_t f = 0; f < k.size(); ++f) {
        sum += k[f];
        EXPECT_LE(k[f], 3 * m);
        if (f > 0) {
          EXPECT_LE(k[f], k[f - 1]);
          EXPECT_GE(k[f], k[f - 1] - 1);
        }
      }
      EXPECT_EQ(sum, dims / 2) << "M=" << m << " dims=" << dims;
      EXPECT_EQ(static_cast<std::int64_t>(mla_rope_theta(hp, m, dims).size()), dims / 2);
    }
  EXPECT_EQ(rope_member(0, 3, 4), 0);  // a partial round of 3 over 4 members: 0, 1, 2
  EXPECT_EQ(rope_member(2, 3, 4), 2);
  EXPECT_EQ(rope_member(5, 6, 4), 2);  // one full round, then 2 at members 0 and 2
}

TEST(MlaConvert, FoldedRotationWithinMembersIsExact) {
  // The rotation identity under FreqFold: a U_f that only mixes the heads of one member (column
  // c in rows g·M + c mod M) leaves every score unchanged once component c rotates at member
  // c mod M's frequency.
  const std::int64_t e = 48, hq = 6, hkv = 3, d = 16, n_rot = 16;
  const Layer L = make_layer(e, hq, hkv, d, n_rot, test::base_seed() + 50);
  for (int m : {2, 4}) {
    RoRopeBasis b;
    b.freqfold = m;
    b.n = hkv * m;
    const std::int64_t groups = n_rot / 2 / m;
    for (std::int64_t f = 0; f < groups; ++f) {
      // A random rotation of the Hkv heads per member (Gram–Schmidt of a Gaussian matrix).
      Vec u(static_cast<std::size_t>(b.n * b.n), 0.0);
      for (std::int64_t mm = 0; mm < m; ++mm) {
        Vec a = normal(static_cast<std::size_t>(hkv * hkv), test::base_seed() + 51, static_cast<std::uint64_t>(f * 8 + mm));
        for (std::int64_t c = 0; c < hkv; ++c) {
          for (std::int64_t c2 = 0; c2 < c; ++c2) {
            double dot = 0;
            for (std::int64_t g = 0; g < hkv; ++g) dot += a[g * hkv + c] * a[g * hkv + c2];
            for (std::int64_t g = 0; g < hkv; ++g) a[g * hkv + c] -= dot * a[g * hkv + c2];
          }
          double nn = 0;
          for (std::int64_t g = 0; g < hkv; ++g) nn += a[g * hkv + c] * a[g * hkv + c];
          for (std::int64_t g = 0; g < hkv; ++g) a[g * hkv + c] /= std::sqrt(nn);
        }
        for (std::int64_t g = 0; g < hkv; ++g)
          for (std::int64_t c = 0; c < hkv; ++c) u[(g * m + mm) * b.n + (c * m + mm)] = a[g * hkv + c];
      }
      b.u.push_back(u);
      b.eigenvalues.emplace_back(static_cast<std::size_t>(b.n), 0.0);
    }
    const MlaLayerWeights w = rorope_merge(L.hp, L.wq, L.wk, L.wv, b);
    const Vec xn = tokens(L, 10, test::base_seed() + 52);
    for (std::int64_t p : kPositions) {
      const Attn ref = gqa(L, xn, 10, p), got = mla(w, e, xn, 10, p);
      EXPECT_LE(rel_err(got.scores, ref.scores), kRewriteTol) << "M=" << m << " pos " << p;
      EXPECT_LE(rel_err(got.out, ref.out), kRewriteTol) << "M=" << m << " pos " << p;
    }
  }
}

TEST(MlaConvert, RopeDimsBelowOneHead) {
  const Layer L = make_layer(48, 6, 3, 16, 16, test::base_seed() + 60);
  const Vec xn = tokens(L, 12, test::base_seed() + 61);
  for (int m : {1, 2, 4}) {
    // rope_heads = h is rope_dims = h·n_rot, to the last bit.
    MlaOptions a, b;
    a.rope_heads = 2;
    b.rope_dims = 32;
    a.freqfold = b.freqfold = m;
    a.rank = b.rank = 40;
    const MlaLayerWeights wa = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, a);
    const MlaLayerWeights wb = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, b);
    EXPECT_EQ(wa.w_kr, wb.w_kr);
    EXPECT_EQ(wa.w_dkv, wb.w_dkv);
    EXPECT_EQ(wa.rope_theta, wb.rope_theta);
    // Fewer dims than one head: the shapes follow and more dims keep more RoPE energy.
    double prev = 0;
    for (std::int64_t dims : {2, 6, 8, 12, 16, 30}) {
      MlaOptions o;
      o.rope_dims = dims;
      o.freqfold = m;
      MlaConversionStats st;
      const MlaLayerWeights w = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, o, &st);
      EXPECT_EQ(w.d_rope, dims);
      EXPECT_EQ(w.d_nope, 48 - dims);
      EXPECT_EQ(w.rank, 48 - dims + 48);
      EXPECT_EQ(w.rope_theta, mla_rope_theta(L.hp, m, dims));
      EXPECT_GT(st.rope_energy_kept, prev) << "M=" << m << " dims=" << dims;
      EXPECT_LT(st.rope_energy_kept, 1.0);
      prev = st.rope_energy_kept;
      // A query and a key at the same position see no rotation, so there the untruncated layer
      // (only RoPE removed) still equals GQA; elsewhere it does not.
      const Attn ref = gqa(L, xn, 12, 1000), got = mla(w, 48, xn, 12, 1000);
      Vec dg, dr;
      for (std::int64_t h = 0; h < 6; ++h)
        for (std::int64_t i = 0; i < 12; ++i) {
          dg.push_back(got.scores[(h * 12 + i) * 12 + i]);
          dr.push_back(ref.scores[(h * 12 + i) * 12 + i]);
        }
      EXPECT_LE(rel_err(dg, dr), kRewriteTol) << "M=" << m << " dims=" << dims;
      EXPECT_GT(rel_err(got.scores, ref.scores), 1e-6) << "M=" << m << " dims=" << dims;
    }
  }
}

TEST(MlaConvert, RopeRemovalKeepsTheStrongestComponents) {
  const Layer L = make_layer(48, 6, 3, 16, 16, test::base_seed() + 20);
  for (int m : {1, 2, 4}) {
    for (int rh = 1; rh < 3; ++rh) {
      MlaOptions opt;
      opt.rope_heads = rh;
      opt.freqfold = m;
      MlaConversionStats st;
      const MlaLayerWeights w = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt, &st);
      EXPECT_EQ(w.d_rope, rh * 16);
      EXPECT_EQ(w.d_nope, 3 * 16 - rh * 16);
      EXPECT_EQ(static_cast<std::int64_t>(w.rope_theta.size()), w.d_rope / 2);
      // The top components hold more than their share of the RoPE-key energy.
      EXPECT_GT(st.rope_energy_kept, rh / 3.0) << "M=" << m << " rope_heads=" << rh;
      EXPECT_LT(st.rope_energy_kept, 1.0);
    }
  }
}

TEST(MlaConvert, PcaExactAtFullRankErrorFallsWithRank) {
  const Layer L = make_layer(64, 6, 3, 16, 16, test::base_seed() + 30);
  MlaOptions opt;
  opt.rope_heads = 1;
  opt.freqfold = 2;
  const MlaLayerWeights untruncated = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt);
  const std::int64_t full = untruncated.rank;
  ASSERT_EQ(full, 3 * 16 - 16 + 3 * 16);
  const Vec xn = tokens(L, 16, test::base_seed() + 31);
  const std::int64_t p = 777;
  const Attn ref = mla(untruncated, 64, xn, 16, p);
  // rank = full goes through the balanced PCA: an exact change of basis of the latent.
  opt.rank = full;
  MlaConversionStats st;
  const MlaLayerWeights same = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt, &st);
  EXPECT_EQ(same.rank, full);
  EXPECT_GT(st.alpha, 1.0);  // keys outweigh values here, as in real models
  const Attn got = mla(same, 64, xn, 16, p);
  EXPECT_LE(rel_err(got.scores, ref.scores), kRewriteTol);
  EXPECT_LE(rel_err(got.out, ref.out), kRewriteTol);
  opt.rank = 1000;  // beyond the full width: no truncation either
  EXPECT_EQ(convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt).rank, full);
  // With truncation the error falls as the rank grows.
  double prev_s = std::numeric_limits<double>::infinity(), prev_o = prev_s, prev_kept = 0;
  for (std::int64_t r : {full / 8, full / 4, full / 2, 3 * full / 4, full - 1}) {
    opt.rank = r;
    const MlaLayerWeights w = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt, &st);
    EXPECT_EQ(w.rank, r);
    EXPECT_EQ(w.cache_width(), r + 16);
    const Attn a = mla(w, 64, xn, 16, p);
    const double es = rel_err(a.scores, ref.scores), eo = rel_err(a.out, ref.out);
    EXPECT_LT(es, prev_s) << "r=" << r;
    EXPECT_LT(eo, prev_o) << "r=" << r;
    EXPECT_GT(st.latent_energy_kept, prev_kept) << "r=" << r;
    prev_s = es;
    prev_o = eo;
    prev_kept = st.latent_energy_kept;
  }
  EXPECT_GT(prev_s, 0.0);
}

TEST(MlaConvert, BalanceScalesAlphaAndTradesKeyErrorForValueError) {
  // z = [k_nope/α; v] with α = b·α₀. The rank-r PCA minimises Ek/α² + Ev (errors in the
  // calibration metric tr(ΔW·C·ΔWᵀ)), so as b grows the key error cannot fall and the value
  // error cannot rise ((w1 − w2)(Ek1 − Ek2) <= 0 for the two optima).
  const Layer L = make_layer(64, 6, 3, 16, 16, test::base_seed() + 35);
  const std::int64_t e = 64, hq = 6, group = 2, d = 16;
  MlaOptions opt;
  opt.rope_heads = 1;
  opt.freqfold = 2;
  const MlaLayerWeights full = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt);
  const std::int64_t dn = full.d_nope, r = full.rank / 4;
  const Vec& c = L.calib.xn_cov;
  // tr(D·C·Dᵀ) for D = A − B (rows of E).
  const auto metric = [&](const std::vector<Vec>& a, const std::vector<Vec>& b) {
    double t = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
      for (std::int64_t x = 0; x < e; ++x)
        for (std::int64_t y = 0; y < e; ++y)
          t += (a[i][x] - b[i][x]) * c[x * e + y] * (a[i][y] - b[i][y]);
    return t;
  };
  // Rows of the keys (head 0's view of the NoPE key: all heads share it) and of every group's
  // values, as the layer computes them from xn: up·w_dkv.
  const auto rows = [&](const MlaLayerWeights& w, bool keys) {
    std::vector<Vec> out;
    const std::int64_t n = keys ? dn : d;
    for (std::int64_t g = 0; g < (keys ? 1 : hq / group); ++g)
      for (std::int64_t i = 0; i < n; ++i) {
        Vec row(static_cast<std::size_t>(e), 0.0);
        const double* up = keys ? &w.w_uk[static_cast<std::size_t>(i * w.rank)]
                                : &w.w_uv[static_cast<std::size_t>((g * group * d + i) * w.rank)];
        for (std::int64_t k = 0; k < w.rank; ++k)
          for (std::int64_t x = 0; x < e; ++x) row[x] += up[k] * w.w_dkv[static_cast<std::size_t>(k * e + x)];
        out.push_back(row);
      }
    return out;
  };
  const std::vector<Vec> k_ref = rows(full, true), v_ref = rows(full, false);
  double alpha1 = 0, prev_k = -1, prev_v = std::numeric_limits<double>::infinity();
  for (const double b : {0.5, 1.0, 2.0, 4.0}) {
    opt.rank = r;
    opt.balance = b;
    MlaConversionStats st;
    const MlaLayerWeights w = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt, &st);
    if (b == 1.0) alpha1 = st.alpha;
    const double ek = metric(rows(w, true), k_ref), ev = metric(rows(w, false), v_ref);
    EXPECT_GE(ek, prev_k * (1 - 1e-9)) << "b=" << b;
    EXPECT_LE(ev, prev_v * (1 + 1e-9)) << "b=" << b;
    prev_k = ek;
    prev_v = ev;
    if (b == 4.0) {
      EXPECT_NEAR(st.alpha, 4 * alpha1, 1e-12 * alpha1);
      EXPECT_GT(ek, 0.0);
    }
  }
  // At full rank any balance is an exact change of basis.
  opt.rank = full.rank;
  opt.balance = 3;
  const Vec xn = tokens(L, 8, test::base_seed() + 36);
  const Attn ref = mla(full, e, xn, 8, 500), got = mla(convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt), e, xn, 8, 500);
  EXPECT_LE(rel_err(got.scores, ref.scores), kRewriteTol);
  EXPECT_LE(rel_err(got.out, ref.out), kRewriteTol);
}

TEST(MlaConvert, ExactMergeThroughPcaAtFullRank) {
  // rope_heads = Hkv and rank = full: the PCA path on the exact merge still equals GQA.
  const Layer L = make_layer(48, 6, 2, 8, 8, test::base_seed() + 40);
  MlaOptions opt;
  opt.rope_heads = 2;
  opt.rank = 16;
  const MlaLayerWeights w = convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, L.calib, opt);
  ASSERT_EQ(w.rank, 16);
  const Vec xn = tokens(L, 12, 5);
  const Attn ref = gqa(L, xn, 12, 31), got = mla(w, 48, xn, 12, 31);
  EXPECT_LE(rel_err(got.scores, ref.scores), kRewriteTol);
  EXPECT_LE(rel_err(got.out, ref.out), kRewriteTol);
}

void expect_refused(const Layer& L, const MlaOptions& opt, const MlaCalibration& calib,
                    const std::string& needle) {
  try {
    convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, calib, opt);
    ADD_FAILURE() << "not refused: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MlaConvert, RefusesBadOptionsByName) {
  const Layer L = make_layer(32, 4, 2, 8, 8, test::base_seed());
  MlaOptions opt;
  opt.rope_heads = 0;
  expect_refused(L, opt, L.calib, "rope_heads");
  opt.rope_heads = 3;
  expect_refused(L, opt, L.calib, "rope_heads: must be in 1..2");
  opt.rope_heads = 1;
  opt.rope_dims = 7;
  expect_refused(L, opt, L.calib, "rope_dims: must be an even number in 2..16");
  opt.rope_dims = 18;
  expect_refused(L, opt, L.calib, "rope_dims: must be an even number in 2..16");
  opt.rope_dims = -2;
  expect_refused(L, opt, L.calib, "rope_dims");
  opt.rope_dims = 0;
  for (const double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    opt.balance = bad;
    expect_refused(L, opt, L.calib, "balance: the key/value balance multiplier must be a positive number");
  }
  opt.balance = 1;
  opt.rope_dims = 0;
  opt.freqfold = 3;
  expect_refused(L, opt, L.calib, "freqfold: 3 does not divide the 4 RoPE frequencies");
  opt.freqfold = 0;
  expect_refused(L, opt, L.calib, "freqfold");
  opt.freqfold = 1;
  opt.rank = -1;
  expect_refused(L, opt, L.calib, "mla_rank");
  opt.rank = 0;
  opt.low_rank_query = true;
  expect_refused(L, opt, L.calib, "low_rank_query");
  opt.low_rank_query = false;
  MlaCalibration bad = L.calib;
  bad.xn_cov.pop_back();
  expect_refused(L, opt, bad, "xn_cov has 1023 values, expected [E, E]");
  bad = L.calib;
  bad.xn_cov[5] = std::numeric_limits<double>::quiet_NaN();
  expect_refused(L, opt, bad, "non-finite");
  Layer broken = L;
  broken.wk.resize(10);
  expect_refused(broken, opt, L.calib, "wk has 10 values");
  broken = L;
  broken.hp.n_head = 3;  // not a multiple of Hkv
  expect_refused(broken, opt, L.calib, "MLA conversion");
  // An empty covariance is the identity: accepted.
  EXPECT_NO_THROW(convert_layer_to_mla(L.hp, L.wq, L.wk, L.wv, MlaCalibration{}, opt));
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::transform
