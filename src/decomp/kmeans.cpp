#include "numattn/decomp/kmeans.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <cmath>
#include <limits>
#include <numeric>

#include "numattn/core/blas.h"
#include "numattn/core/rng.h"

namespace numattn::decomp {

namespace {

constexpr index_t kRowBlock = 1024;  // rows per score GEMM: bounds the n × k scratch

struct Data {
  const float* x;
  index_t n, d, ld;
  bool spherical;
  std::vector<float> norm2;  ///< ‖x‖² (Euclidean only)
  const float* row(index_t i) const { return x + i * ld; }
};

/// x·y in float32 with 16 independent lanes (vectorises; the order is fixed, so deterministic).
float dot_f32(const float* x, const float* y, index_t d) {
  float lane[16] = {};
  index_t t = 0;
  for (; t + 16 <= d; t += 16)
    for (int l = 0; l < 16; ++l) lane[l] += x[t + l] * y[t + l];
  float s = 0;
  for (; t < d; ++t) s += x[t] * y[t];
  for (int l = 0; l < 16; ++l) s += lane[l];
  return s;
}

/// d2[i] ← min(d2[i], dist(x_i, c)) for one new centre c (k-means++) over the rows `rows`.
void update_d2(const Data& X, const std::vector<index_t>& rows, const float* c, std::vector<double>& d2) {
  double c2 = 0;
  for (index_t t = 0; t < X.d; ++t) c2 += static_cast<double>(c[t]) * c[t];
  for (std::size_t u = 0; u < rows.size(); ++u) {
    const index_t i = rows[u];
    const double dot = dot_f32(X.row(i), c, X.d);
    const double v = X.spherical ? 1 - dot : std::max(0.0, X.norm2[static_cast<std::size_t>(i)] - 2 * dot + c2);
    d2[u] = std::min(d2[u], v);
  }
}

/// Nearest centroid of every row (ties: lower index) and its distance. Returns rows changed.
index_t assign_step(const Data& X, const std::vector<float>& C, index_t k, std::vector<std::int32_t>& a,
                    std::vector<double>& best, std::vector<float>& s) {
  std::vector<float> c2(static_cast<std::size_t>(k));
  for (index_t c = 0; c < k; ++c) {
    double t = 0;
    for (index_t u = 0; u < X.d; ++u) t += static_cast<double>(C[static_cast<std::size_t>(c * X.d + u)]) * C[static_cast<std::size_t>(c * X.d + u)];
    c2[static_cast<std::size_t>(c)] = static_cast<float>(t);
  }
  index_t changed = 0;
  s.resize(static_cast<std::size_t>(std::min(X.n, kRowBlock) * k));
  for (index_t i0 = 0; i0 < X.n; i0 += kRowBlock) {
    const index_t rows = std::min(kRowBlock, X.n - i0);
    centroid_scores(X.row(i0), rows, X.d, X.ld, C.data(), k, s.data());
    for (index_t r = 0; r < rows; ++r) {
      const float* sr = s.data() + r * k;
      index_t arg = 0;
      float bd = std::numeric_limits<float>::infinity();
      for (index_t c = 0; c < k; ++c) {
        const float dv = X.spherical ? -sr[c] : c2[static_cast<std::size_t>(c)] - 2 * sr[c];
        if (dv < bd) {
          bd = dv;
          arg = c;
        }
      }
      const index_t i = i0 + r;
      const double full = X.spherical ? 1.0 + bd : std::max(0.0, static_cast<double>(X.norm2[static_cast<std::size_t>(i)]) + bd);
      best[static_cast<std::size_t>(i)] = full;
      if (a[static_cast<std::size_t>(i)] != static_cast<std::int32_t>(arg)) {
        a[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(arg);
        ++changed;
      }
    }
  }
  return changed;
}

void normalize(float* c, index_t d) {
  double n2 = 0;
  for (index_t t = 0; t < d; ++t) n2 += static_cast<double>(c[t]) * c[t];
  if (n2 > 0) {
    const double inv = 1 / std::sqrt(n2);
    for (index_t t = 0; t < d; ++t) c[t] = static_cast<float>(c[t] * inv);
  }
}

}  // namespace

void centroid_scores(const float* x, index_t n, index_t d, index_t ldx, const float* c, index_t k, float* s) {
  if (n == 0 || k == 0) return;
  if (d == 0) {
    std::fill(s, s + n * k, 0.f);
    return;
  }
  blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, k, d, 1.f, x, ldx, c, d, 0.f, s, k);
}

void normalized_rows(const float* x, index_t n, index_t d, index_t ldx, float* out) {
  for (index_t i = 0; i < n; ++i) {
    const float* r = x + i * ldx;
    double n2 = 0;
    for (index_t t = 0; t < d; ++t) n2 += static_cast<double>(r[t]) * r[t];
    const double inv = n2 > 0 ? 1 / std::sqrt(n2) : 0.0;
    for (index_t t = 0; t < d; ++t) out[i * d + t] = static_cast<float>(r[t] * inv);
  }
}

std::vector<std::vector<index_t>> top_w_members(const float* s, index_t n, index_t k, index_t w) {
  std::vector<std::vector<index_t>> out(static_cast<std::size_t>(k));
  w = std::clamp<index_t>(w, 0, n);
  // One 64-bit key per row: the score's order-preserving bits above the complemented row index,
  // so "larger key" = larger score, then lower row; nth_element on plain integers.
  std::vector<std::uint64_t> key(static_cast<std::size_t>(n));
  for (index_t c = 0; c < k; ++c) {
    for (index_t i = 0; i < n; ++i) {
      const auto u = std::bit_cast<std::uint32_t>(s[i * k + c] + 0.0f);  // −0 → +0
      const std::uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
      key[static_cast<std::size_t>(i)] = (static_cast<std::uint64_t>(ord) << 32) | (0xffffffffu - static_cast<std::uint32_t>(i));
    }
    if (w < n) std::nth_element(key.begin(), key.begin() + w, key.end(), std::greater<std::uint64_t>());
    std::vector<index_t>& m = out[static_cast<std::size_t>(c)];
    m.resize(static_cast<std::size_t>(w));
    for (index_t u = 0; u < w; ++u) m[static_cast<std::size_t>(u)] = static_cast<index_t>(0xffffffffu - static_cast<std::uint32_t>(key[static_cast<std::size_t>(u)]));
    std::sort(m.begin(), m.end());
  }
  return out;
}

KMeansResult kmeans(const float* x, index_t n, index_t d, index_t ldx, const KMeansOptions& opt) {
  KMeansResult res;
  res.d = d;
  if (n <= 0) return res;
  const index_t k = std::clamp<index_t>(opt.k, 1, n);
  res.k = k;
  Data X{x, n, d, ldx, opt.spherical, {}};
  std::vector<float> unit;
  if (opt.spherical) {
    unit.resize(static_cast<std::size_t>(n * d));
    normalized_rows(x, n, d, ldx, unit.data());
    X.x = unit.data();
    X.ld = d;
  } else {
    X.norm2.resize(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      double t = 0;
      for (index_t u = 0; u < d; ++u) t += static_cast<double>(X.row(i)[u]) * X.row(i)[u];
      X.norm2[static_cast<std::size_t>(i)] = static_cast<float>(t);
    }
  }

  // Initial centres.
  std::vector<float>& C = res.centroids;
  C.assign(static_cast<std::size_t>(k * d), 0.f);
  const CounterRng rng(opt.seed, opt.stream);
  std::vector<char> chosen(static_cast<std::size_t>(n), 0);
  auto take = [&](index_t c, index_t i) {
    std::copy(X.row(i), X.row(i) + d, C.begin() + c * d);
    chosen[static_cast<std::size_t>(i)] = 1;
  };
  auto first_free = [&]() {
    index_t i = 0;
    while (i < n && chosen[static_cast<std::size_t>(i)]) ++i;
    return std::min(i, n - 1);
  };
  if (opt.plusplus) {
    // k-means++ seeding on a uniform subsample of at most max(16·k, 1024) rows (all rows when n
    // is smaller): the D² draws are sequential, k passes over the sample, which on all n rows
    // would cost more than the Lloyd iterations themselves.
    const index_t m = std::min(n, std::max<index_t>(16 * k, 1024));
    std::vector<index_t> rows(static_cast<std::size_t>(n));
    std::iota(rows.begin(), rows.end(), 0);
    if (m < n) {
      for (index_t u = 0; u < m; ++u) {  // partial Fisher–Yates on a separate counter range
        const index_t r = u + std::min<index_t>(static_cast<index_t>(rng.uniform(static_cast<std::uint64_t>(k + u)) * static_cast<double>(n - u)), n - u - 1);
        std::swap(rows[static_cast<std::size_t>(u)], rows[static_cast<std::size_t>(r)]);
      }
      rows.resize(static_cast<std::size_t>(m));
      std::sort(rows.begin(), rows.end());
    }
    std::vector<double> d2(static_cast<std::size_t>(m), std::numeric_limits<double>::infinity());
    index_t pick = std::min<index_t>(static_cast<index_t>(rng.uniform(0) * static_cast<double>(m)), m - 1);
    take(0, rows[static_cast<std::size_t>(pick)]);
    update_d2(X, rows, C.data(), d2);
    d2[static_cast<std::size_t>(pick)] = 0;
    for (index_t c = 1; c < k; ++c) {
      double total = 0;
      for (double v : d2) total += v;
      pick = -1;
      if (total > 0 && std::isfinite(total)) {
        const double target = rng.uniform(static_cast<std::uint64_t>(c)) * total;
        double acc = 0;
        for (index_t u = 0; u < m; ++u) {
          acc += d2[static_cast<std::size_t>(u)];
          if (acc > target && d2[static_cast<std::size_t>(u)] > 0) {
            pick = u;
            break;
          }
        }
        if (pick < 0)  // rounding at the end of the cumulative sum: the last row with weight
          for (index_t u = m - 1; u >= 0 && pick < 0; --u)
            if (d2[static_cast<std::size_t>(u)] > 0) pick = u;
      }
      if (pick < 0) {  // every sampled row coincides with a centre: the first row not taken
        take(c, first_free());
        continue;
      }
      take(c, rows[static_cast<std::size_t>(pick)]);
      update_d2(X, rows, C.data() + c * d, d2);
      d2[static_cast<std::size_t>(pick)] = 0;  // exactly: rounding must not let it be drawn again
    }
  } else {
    // k distinct rows: a partial Fisher–Yates shuffle driven by the counter RNG.
    std::vector<index_t> perm(static_cast<std::size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    for (index_t c = 0; c < k; ++c) {
      const index_t r = c + std::min<index_t>(static_cast<index_t>(rng.uniform(static_cast<std::uint64_t>(c)) * static_cast<double>(n - c)), n - c - 1);
      std::swap(perm[static_cast<std::size_t>(c)], perm[static_cast<std::size_t>(r)]);
      take(c, perm[static_cast<std::size_t>(c)]);
    }
  }

  // Lloyd iterations.
  std::vector<std::int32_t>& a = res.assign;
  a.assign(static_cast<std::size_t>(n), -1);
  std::vector<double> best(static_cast<std::size_t>(n));
  std::vector<float> scratch;
  std::vector<double> sum(static_cast<std::size_t>(k * d));
  std::vector<index_t> cnt(static_cast<std::size_t>(k));
  assign_step(X, C, k, a, best, scratch);
  for (int it = 0; it < opt.iters; ++it) {
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(cnt.begin(), cnt.end(), 0);
    for (index_t i = 0; i < n; ++i) {
      const auto c = static_cast<index_t>(a[static_cast<std::size_t>(i)]);
      ++cnt[static_cast<std::size_t>(c)];
      const float* r = X.row(i);
      double* s = sum.data() + c * d;
      for (index_t u = 0; u < d; ++u) s[u] += r[u];
    }
    std::fill(chosen.begin(), chosen.end(), 0);
    for (index_t c = 0; c < k; ++c) {
      float* cc = C.data() + c * d;
      if (cnt[static_cast<std::size_t>(c)] > 0) {
        const double inv = 1.0 / static_cast<double>(cnt[static_cast<std::size_t>(c)]);
        for (index_t u = 0; u < d; ++u) cc[u] = static_cast<float>(sum[static_cast<std::size_t>(c * d + u)] * inv);
        if (opt.spherical) normalize(cc, d);
        continue;
      }
      // Empty: re-seed at the row farthest from its centre (not taken by another empty one).
      index_t far = -1;
      for (index_t i = 0; i < n; ++i)
        if (!chosen[static_cast<std::size_t>(i)] && (far < 0 || best[static_cast<std::size_t>(i)] > best[static_cast<std::size_t>(far)])) far = i;
      if (far < 0) continue;
      chosen[static_cast<std::size_t>(far)] = 1;
      std::copy(X.row(far), X.row(far) + d, cc);
    }
    res.iterations = it + 1;
    if (assign_step(X, C, k, a, best, scratch) == 0) {
      res.converged = true;
      break;
    }
  }
  res.sizes.assign(static_cast<std::size_t>(k), 0);
  res.inertia = 0;
  for (index_t i = 0; i < n; ++i) {
    ++res.sizes[static_cast<std::size_t>(a[static_cast<std::size_t>(i)])];
    res.inertia += best[static_cast<std::size_t>(i)];
  }
  return res;
}

}  // namespace numattn::decomp
