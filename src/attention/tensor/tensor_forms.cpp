#include "numattn/attention/tensor_forms.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/simd.h"

namespace numattn {

namespace {

using blas::Trans;

void check_sizes(const char* what, std::initializer_list<index_t> sizes) {
  for (index_t s : sizes) NUMATTN_CHECK(s >= 1, "{}: every size must be ≥ 1 (got {})", what, s);
}

/// Row-wise softmax of an r × c float matrix in place (max-shifted).
void softmax_rows(float* s, index_t r, index_t c) {
  for (index_t i = 0; i < r; ++i) {
    float* row = s + i * c;
    const float m = *std::max_element(row, row + c);
    float sum = 0;
    for (index_t j = 0; j < c; ++j) {
      row[j] = simd::exp_f32(row[j] - m);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (index_t j = 0; j < c; ++j) row[j] *= inv;
  }
}

/// x `[N1, N2, D]` → `[N2, N1, D]` (the mode-2 unfolding's row order).
std::vector<float> swap_modes(const float* x, index_t n1, index_t n2, index_t d) {
  std::vector<float> y(static_cast<std::size_t>(n1 * n2 * d));
  for (index_t a = 0; a < n1; ++a)
    for (index_t b = 0; b < n2; ++b) std::copy(x + (a * n2 + b) * d, x + (a * n2 + b + 1) * d, y.data() + (b * n1 + a) * d);
  return y;
}

/// S1 (N1 × N1) and S2 (N2 × N2) of HOT, float32 through sgemm.
void hot_scores(const float* q, const float* k, index_t n1, index_t n2, index_t d, std::vector<float>& s1,
                std::vector<float>& s2) {
  s1.assign(static_cast<std::size_t>(n1 * n1), 0.0f);
  s2.assign(static_cast<std::size_t>(n2 * n2), 0.0f);
  const float sc1 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n2 * d)));
  const float sc2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n1 * d)));
  blas::sgemm(Trans::kNo, Trans::kYes, n1, n1, n2 * d, sc1, q, n2 * d, k, n2 * d, 0.0f, s1.data(), n1);
  const std::vector<float> q2 = swap_modes(q, n1, n2, d), k2 = swap_modes(k, n1, n2, d);
  blas::sgemm(Trans::kNo, Trans::kYes, n2, n2, n1 * d, sc2, q2.data(), n1 * d, k2.data(), n1 * d, 0.0f, s2.data(), n2);
  softmax_rows(s1.data(), n1, n1);
  softmax_rows(s2.data(), n2, n2);
}

/// Float64 softmax of the scaled dot products of rows `x[i]` against rows `y[j]` (length L each).
std::vector<double> softmax64(const std::vector<std::vector<double>>& x, const std::vector<std::vector<double>>& y,
                              double scale, bool causal) {
  const std::size_t n = x.size(), m = y.size();
  std::vector<double> p(n * m, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    const std::size_t end = causal ? std::min(m, i + 1) : m;
    for (std::size_t j = 0; j < end; ++j) {
      double t = 0;
      for (std::size_t l = 0; l < x[i].size(); ++l) t += x[i][l] * y[j][l];
      p[i * m + j] = scale * t;
      mx = std::max(mx, p[i * m + j]);
    }
    double sum = 0;
    for (std::size_t j = 0; j < end; ++j) sum += (p[i * m + j] = std::exp(p[i * m + j] - mx));
    for (std::size_t j = 0; j < end; ++j) p[i * m + j] /= sum;
  }
  return p;
}

TensorView<const float> cview(const float* p, index_t heads, index_t n, index_t d, index_t sh, index_t sn) {
  return TensorView<const float>(p, {1, heads, n, d}, {heads * sh + n * sn, sh, sn, 1});
}
TensorView<float> mview(float* p, index_t heads, index_t n, index_t d, index_t sh, index_t sn) {
  return TensorView<float>(p, {1, heads, n, d}, {heads * sh + n * sn, sh, sn, 1});
}

}  // namespace

void hot_modewise_attention(const float* q, const float* k, const float* v, index_t n1, index_t n2, index_t d,
                            index_t dv, float* out) {
  check_sizes("hot_modewise_attention", {n1, n2, d, dv});
  std::vector<float> s1, s2;
  hot_scores(q, k, n1, n2, d, s1, s2);
  // T = S1 · V_(1) (N1 × N2·Dv), then O[a] = S2 · T[a] for each a.
  std::vector<float> t(static_cast<std::size_t>(n1 * n2 * dv));
  blas::sgemm(Trans::kNo, Trans::kNo, n1, n2 * dv, n1, 1.0f, s1.data(), n1, v, n2 * dv, 0.0f, t.data(), n2 * dv);
  for (index_t a = 0; a < n1; ++a)
    blas::sgemm(Trans::kNo, Trans::kNo, n2, dv, n2, 1.0f, s2.data(), n2, t.data() + a * n2 * dv, dv, 0.0f,
                out + a * n2 * dv, dv);
}

void hot_dense_attention(const float* q, const float* k, const float* v, index_t n1, index_t n2, index_t d,
                         index_t dv, float* out) {
  check_sizes("hot_dense_attention", {n1, n2, d, dv});
  std::vector<float> s1, s2;
  hot_scores(q, k, n1, n2, d, s1, s2);
  const index_t n = n1 * n2;
  std::vector<float> a(static_cast<std::size_t>(n * n));
  for (index_t i1 = 0; i1 < n1; ++i1)
    for (index_t i2 = 0; i2 < n2; ++i2) {
      float* row = a.data() + (i1 * n2 + i2) * n;
      for (index_t j1 = 0; j1 < n1; ++j1) {
        const float x = s1[static_cast<std::size_t>(i1 * n1 + j1)];
        const float* r2 = s2.data() + i2 * n2;
        for (index_t j2 = 0; j2 < n2; ++j2) row[j1 * n2 + j2] = x * r2[j2];
      }
    }
  blas::sgemm(Trans::kNo, Trans::kNo, n, dv, n, 1.0f, a.data(), n, v, dv, 0.0f, out, dv);
}

std::vector<double> hot_reference(const float* q, const float* k, const float* v, index_t n1, index_t n2, index_t d,
                                  index_t dv) {
  check_sizes("hot_reference", {n1, n2, d, dv});
  auto rows = [&](const float* x, int mode) {
    std::vector<std::vector<double>> r(static_cast<std::size_t>(mode == 1 ? n1 : n2));
    for (index_t a = 0; a < n1; ++a)
      for (index_t b = 0; b < n2; ++b)
        for (index_t c = 0; c < d; ++c) r[static_cast<std::size_t>(mode == 1 ? a : b)].push_back(x[(a * n2 + b) * d + c]);
    return r;
  };
  const std::vector<double> s1 = softmax64(rows(q, 1), rows(k, 1), 1 / std::sqrt(static_cast<double>(n2 * d)), false);
  const std::vector<double> s2 = softmax64(rows(q, 2), rows(k, 2), 1 / std::sqrt(static_cast<double>(n1 * d)), false);
  std::vector<double> o(static_cast<std::size_t>(n1 * n2 * dv), 0.0);
  for (index_t a = 0; a < n1; ++a)
    for (index_t b = 0; b < n2; ++b)
      for (index_t a2 = 0; a2 < n1; ++a2)
        for (index_t b2 = 0; b2 < n2; ++b2) {
          const double w = s1[static_cast<std::size_t>(a * n1 + a2)] * s2[static_cast<std::size_t>(b * n2 + b2)];
          for (index_t c = 0; c < dv; ++c) o[static_cast<std::size_t>((a * n2 + b) * dv + c)] += w * v[(a2 * n2 + b2) * dv + c];
        }
  return o;
}

void axial_attention(const float* q, const float* k, const float* v, index_t n1, index_t n2, index_t d, index_t dv,
                     bool causal, float* out, const ExecContext& ctx) {
  check_sizes("axial_attention", {n1, n2, d, dv});
  const auto flash = create_exact_method();
  std::vector<float> y(static_cast<std::size_t>(n1 * n2 * dv));
  // Pass 1, along axis 2: "head" a, sequence b (contiguous rows).
  AttentionProblem p;
  p.q = cview(q, n1, n2, d, n2 * d, d);
  p.k = cview(k, n1, n2, d, n2 * d, d);
  p.v = cview(v, n1, n2, dv, n2 * dv, dv);
  p.out = mview(y.data(), n1, n2, dv, n2 * dv, dv);
  p.causal = causal ? Causal::kTopLeft : Causal::kNone;
  flash->run(p, ctx);
  // Pass 2, along axis 1: "head" b, sequence a (rows N2 apart), values from pass 1.
  AttentionProblem c = p;
  c.q = cview(q, n2, n1, d, d, n2 * d);
  c.k = cview(k, n2, n1, d, d, n2 * d);
  c.v = cview(y.data(), n2, n1, dv, dv, n2 * dv);
  c.out = mview(out, n2, n1, dv, dv, n2 * dv);
  flash->run(c, ctx);
}

std::vector<double> axial_reference(const float* q, const float* k, const float* v, index_t n1, index_t n2,
                                    index_t d, index_t dv, bool causal) {
  check_sizes("axial_reference", {n1, n2, d, dv});
  const double s = 1 / std::sqrt(static_cast<double>(d));
  auto vec = [&](const float* x, index_t a, index_t b) {
    return std::vector<double>(x + (a * n2 + b) * d, x + (a * n2 + b + 1) * d);
  };
  // P^row_a (N2 × N2) for each a, P^col_b (N1 × N1) for each b.
  std::vector<std::vector<double>> prow(static_cast<std::size_t>(n1)), pcol(static_cast<std::size_t>(n2));
  for (index_t a = 0; a < n1; ++a) {
    std::vector<std::vector<double>> qa, ka;
    for (index_t b = 0; b < n2; ++b) {
      qa.push_back(vec(q, a, b));
      ka.push_back(vec(k, a, b));
    }
    prow[static_cast<std::size_t>(a)] = softmax64(qa, ka, s, causal);
  }
  for (index_t b = 0; b < n2; ++b) {
    std::vector<std::vector<double>> qb, kb;
    for (index_t a = 0; a < n1; ++a) {
      qb.push_back(vec(q, a, b));
      kb.push_back(vec(k, a, b));
    }
    pcol[static_cast<std::size_t>(b)] = softmax64(qb, kb, s, causal);
  }
  // The dense N1N2 × N1N2 matrix, one row at a time.
  std::vector<double> o(static_cast<std::size_t>(n1 * n2 * dv), 0.0);
  for (index_t a = 0; a < n1; ++a)
    for (index_t b = 0; b < n2; ++b)
      for (index_t a2 = 0; a2 < n1; ++a2)
        for (index_t b2 = 0; b2 < n2; ++b2) {
          const double w = pcol[static_cast<std::size_t>(b)][static_cast<std::size_t>(a * n1 + a2)] *
                           prow[static_cast<std::size_t>(a2)][static_cast<std::size_t>(b * n2 + b2)];
          for (index_t c = 0; c < dv; ++c) o[static_cast<std::size_t>((a * n2 + b) * dv + c)] += w * v[(a2 * n2 + b2) * dv + c];
        }
  return o;
}

std::size_t tpa_cache_bytes(index_t n, index_t heads, index_t head_dim, index_t rank_k, index_t rank_v) {
  return sizeof(float) * static_cast<std::size_t>(n * (rank_k + rank_v) * (heads + head_dim));
}
std::size_t mha_cache_bytes(index_t n, index_t heads, index_t head_dim) {
  return sizeof(float) * static_cast<std::size_t>(n * 2 * heads * head_dim);
}

namespace {

/// Head h's N × Dh slice of a TPA tensor, X_n[h, :] = (1/R)·Σ_r a[n,r,h]·b[n,r,:].
void tpa_head(const TpaFactors& f, index_t n, index_t heads, index_t dh, index_t h, float* x) {
  const float inv = 1.0f / static_cast<float>(f.rank);
  for (index_t t = 0; t < n; ++t) {
    float* row = x + t * dh;
    std::fill(row, row + dh, 0.0f);
    for (index_t r = 0; r < f.rank; ++r) {
      const float a = f.a[(t * f.rank + r) * heads + h] * inv;
      const float* b = f.b + (t * f.rank + r) * dh;
      for (index_t c = 0; c < dh; ++c) row[c] += a * b[c];
    }
  }
}

}  // namespace

void tpa_attention(const TpaFactors& q, const TpaFactors& k, const TpaFactors& v, index_t n, index_t heads,
                   index_t head_dim, bool causal, float* out, const ExecContext& ctx) {
  check_sizes("tpa_attention", {n, heads, head_dim, q.rank, k.rank, v.rank});
  const auto flash = create_exact_method();
  parallel_for(ctx, heads, [&](std::int64_t h) {
    std::vector<float> qh(static_cast<std::size_t>(n * head_dim)), kh(qh.size()), vh(qh.size());
    tpa_head(q, n, heads, head_dim, h, qh.data());
    tpa_head(k, n, heads, head_dim, h, kh.data());
    tpa_head(v, n, heads, head_dim, h, vh.data());
    AttentionProblem p;
    p.q = cview(qh.data(), 1, n, head_dim, n * head_dim, head_dim);
    p.k = cview(kh.data(), 1, n, head_dim, n * head_dim, head_dim);
    p.v = cview(vh.data(), 1, n, head_dim, n * head_dim, head_dim);
    p.out = mview(out + h * n * head_dim, 1, n, head_dim, n * head_dim, head_dim);
    p.causal = causal ? Causal::kTopLeft : Causal::kNone;
    flash->run(p, ExecContext{1});
  });
}

std::vector<double> tpa_reference(const TpaFactors& q, const TpaFactors& k, const TpaFactors& v, index_t n,
                                  index_t heads, index_t head_dim, bool causal) {
  check_sizes("tpa_reference", {n, heads, head_dim, q.rank, k.rank, v.rank});
  auto entry = [&](const TpaFactors& f, index_t t, index_t h, index_t c) {
    double s = 0;
    for (index_t r = 0; r < f.rank; ++r)
      s += static_cast<double>(f.a[(t * f.rank + r) * heads + h]) * f.b[(t * f.rank + r) * head_dim + c];
    return s / static_cast<double>(f.rank);
  };
  std::vector<double> o(static_cast<std::size_t>(heads * n * head_dim), 0.0);
  for (index_t h = 0; h < heads; ++h) {
    std::vector<std::vector<double>> qs(static_cast<std::size_t>(n)), ks(qs.size());
    for (index_t t = 0; t < n; ++t)
      for (index_t c = 0; c < head_dim; ++c) {
        qs[static_cast<std::size_t>(t)].push_back(entry(q, t, h, c));
        ks[static_cast<std::size_t>(t)].push_back(entry(k, t, h, c));
      }
    const std::vector<double> p = softmax64(qs, ks, 1 / std::sqrt(static_cast<double>(head_dim)), causal);
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < n; ++j) {
        const double w = p[static_cast<std::size_t>(i * n + j)];
        if (w == 0) continue;
        for (index_t c = 0; c < head_dim; ++c) o[static_cast<std::size_t>((h * n + i) * head_dim + c)] += w * entry(v, j, h, c);
      }
  }
  return o;
}

std::vector<double> multilinear_attention(const double* q, const double* k, const double* v, const double* g,
                                          const double* w_o, index_t n, index_t rank, index_t d_out) {
  check_sizes("multilinear_attention", {n, rank, d_out});
  // U = Vᵀ·W^O with W^O seen as N (m) × N·Dout (j, c): U[r, j·Dout + c] = Σ_m V(m,r)·W^O[j + N·m, c].
  std::vector<double> u(static_cast<std::size_t>(rank * n * d_out));
  blas::dgemm(Trans::kYes, Trans::kNo, rank, n * d_out, n, 1.0, v, rank, w_o, n * d_out, 0.0, u.data(), n * d_out);
  // M[r, c] = g_r·Σ_j K(j, r)·U[r, j, c]  (R GEMVs of N × Dout).
  std::vector<double> m(static_cast<std::size_t>(rank * d_out), 0.0);
  for (index_t r = 0; r < rank; ++r) {
    double* mr = m.data() + r * d_out;
    for (index_t j = 0; j < n; ++j) {
      const double kj = k[j * rank + r] * g[r];
      const double* ur = u.data() + (r * n + j) * d_out;
      for (index_t c = 0; c < d_out; ++c) mr[c] += kj * ur[c];
    }
  }
  std::vector<double> o(static_cast<std::size_t>(n * d_out));
  blas::dgemm(Trans::kNo, Trans::kNo, n, d_out, rank, 1.0, q, rank, m.data(), d_out, 0.0, o.data(), d_out);
  return o;
}

std::vector<double> multilinear_reference(const double* q, const double* k, const double* v, const double* g,
                                          const double* w_o, index_t n, index_t rank, index_t d_out) {
  check_sizes("multilinear_reference", {n, rank, d_out});
  std::vector<double> a(static_cast<std::size_t>(n * n * n), 0.0);  // A(i, j, m) at (i·N + j)·N + m
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j)
      for (index_t m = 0; m < n; ++m) {
        double s = 0;
        for (index_t r = 0; r < rank; ++r) s += g[r] * q[i * rank + r] * k[j * rank + r] * v[m * rank + r];
        a[static_cast<std::size_t>((i * n + j) * n + m)] = s;
      }
  std::vector<double> o(static_cast<std::size_t>(n * d_out), 0.0);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j)
      for (index_t m = 0; m < n; ++m)
        for (index_t c = 0; c < d_out; ++c)
          o[static_cast<std::size_t>(i * d_out + c)] += a[static_cast<std::size_t>((i * n + j) * n + m)] * w_o[(j + n * m) * d_out + c];
  return o;
}

}  // namespace numattn
