// Dense float64 transcriptions for the kernel-method tests: features of every row, then the
// masked kernel attention out_i = Σ_{j seen} κ_ij v_j / (c + Σ_{j seen} κ_ij), written apart from
// the fast code (no blocks, no prefix states, no float32).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "numattn/attention/problem.h"

namespace numattn::test {

/// Keys row i sees under the problem's causal rule (problem.h).
inline index_t dense_seen(const AttentionProblem& p, index_t i) {
  if (p.causal == Causal::kNone) return p.n_kv();
  return std::clamp<index_t>(i + p.diag_offset() + 1, 0, p.n_kv());
}

/// κ(b, h, i, j) for query row i of head h and key j of its kv head; out as [B, Hq, Nq, Dv] dense.
/// `clamp`: a negative Σκ counts as 0 (signed estimators); a zero denominator gives a zero row.
inline std::vector<double> dense_kernel_attention(
    const AttentionProblem& p, const std::function<double(index_t, index_t, index_t, index_t)>& kappa,
    double shift = 0, bool clamp = false) {
  const index_t dv = p.d_v();
  std::vector<double> out(static_cast<std::size_t>(p.batch() * p.heads() * p.n_q() * dv), 0.0);
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i) {
        const index_t hk = h / p.group();
        std::vector<double> num(static_cast<std::size_t>(dv), 0.0);
        double den = 0;
        for (index_t j = 0; j < dense_seen(p, i); ++j) {
          const double w = kappa(b, h, i, j);
          den += w;
          for (index_t d = 0; d < dv; ++d) num[static_cast<std::size_t>(d)] += w * p.v(b, hk, j, d);
        }
        if (clamp) den = std::max(den, 0.0);
        den += shift;
        double* o = out.data() + ((b * p.heads() + h) * p.n_q() + i) * dv;
        for (index_t d = 0; d < dv; ++d) o[d] = den == 0 ? 0 : num[static_cast<std::size_t>(d)] / den;
      }
  return out;
}

/// ‖a − out‖_F / ‖a‖_F with `out` the problem's float32 output.
inline double rel_error_vs(const std::vector<double>& a, const AttentionProblem& p) {
  double num = 0, den = 0;
  std::size_t e = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i)
        for (index_t d = 0; d < p.d_v(); ++d, ++e) {
          const double x = a[e], y = p.out(b, h, i, d);
          num += (x - y) * (x - y);
          den += x * x;
        }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// Features of rows of a tensor (b, h, n): φ(√s·x) by `phi` into a [B·H·N][F] array.
inline std::vector<double> dense_features(const TensorView<const float>& x, double scale_sqrt, index_t f,
                                          const std::function<void(index_t, const double*, double*)>& phi) {
  const index_t d = x.shape[3];
  std::vector<double> out(static_cast<std::size_t>(x.shape[0] * x.shape[1] * x.shape[2] * f));
  std::vector<double> xs(static_cast<std::size_t>(d));
  std::size_t r = 0;
  for (index_t b = 0; b < x.shape[0]; ++b)
    for (index_t h = 0; h < x.shape[1]; ++h)
      for (index_t n = 0; n < x.shape[2]; ++n, ++r) {
        for (index_t k = 0; k < d; ++k) xs[static_cast<std::size_t>(k)] = scale_sqrt * x(b, h, n, k);
        phi(h, xs.data(), out.data() + r * f);
      }
  return out;
}

}  // namespace numattn::test
