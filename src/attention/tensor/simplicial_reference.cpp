// The float64 oracle of 2-simplicial attention (simplicial.h): direct summation over pairs,
// written apart from the float32 kernel (no tiling, no online softmax, no packing).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "numattn/attention/simplicial.h"

namespace numattn {

KeyRange simplicial_range(const AttentionProblem& p, index_t i, index_t window) {
  const KeyRange r = p.key_range(i);
  const index_t t = i + p.diag_offset();
  return {std::max(r.begin, t - window + 1), std::min(r.end, t + 1)};
}

double simplicial_flops(const AttentionProblem& p, index_t w1, index_t w2) {
  double pairs = 0;
  for (index_t i = 0; i < p.n_q(); ++i) {
    const KeyRange a = simplicial_range(p, i, w1), c = simplicial_range(p, i, w2);
    if (!a.empty() && !c.empty()) pairs += static_cast<double>(a.end - a.begin) * static_cast<double>(c.end - c.begin);
  }
  return 2.0 * pairs * static_cast<double>(p.d_qk() + p.d_v()) * static_cast<double>(p.batch() * p.heads());
}

double simplicial_reference_row(const AttentionProblem& p, const TensorView<const float>& k2,
                                const TensorView<const float>& v2, index_t w1, index_t w2, index_t b,
                                index_t h, index_t i, double* out_row, double* logit_magnitude) {
  const index_t dk = p.d_qk(), dv = p.d_v(), hk = h / p.group();
  const double s = p.effective_scale();
  std::fill(out_row, out_row + dv, 0.0);
  if (logit_magnitude) *logit_magnitude = 0;
  const KeyRange J = simplicial_range(p, i, w1), K = simplicial_range(p, i, w2);
  if (J.empty() || K.empty()) return -std::numeric_limits<double>::infinity();
  const float* q = p.q.row(b, h, i);
  check_finite_row("q", q, dk, {b, h, i});
  for (index_t j = J.begin; j < J.end; ++j) check_finite_row("k", p.k.row(b, hk, j), dk, {b, hk, j});
  for (index_t k = K.begin; k < K.end; ++k) check_finite_row("k", k2.row(b, hk, k), dk, {b, hk, k});
  for (index_t j = J.begin; j < J.end; ++j) check_finite_row("v", p.v.row(b, hk, j), dv, {b, hk, j});
  for (index_t k = K.begin; k < K.end; ++k) check_finite_row("v", v2.row(b, hk, k), dv, {b, hk, k});

  const index_t nj = J.end - J.begin, nk = K.end - K.begin;
  std::vector<double> logit(static_cast<std::size_t>(nj * nk)), mag(logit.size());
  double m = -std::numeric_limits<double>::infinity();
  for (index_t j = 0; j < nj; ++j) {
    const float* kj = p.k.row(b, hk, J.begin + j);
    for (index_t k = 0; k < nk; ++k) {
      const float* kk = k2.row(b, hk, K.begin + k);
      double t = 0, a = 0;
      for (index_t d = 0; d < dk; ++d) {
        const double x = static_cast<double>(q[d]) * kj[d] * kk[d];
        t += x;
        a += std::abs(x);
      }
      logit[static_cast<std::size_t>(j * nk + k)] = s * t;
      mag[static_cast<std::size_t>(j * nk + k)] = std::abs(s) * a;
      m = std::max(m, s * t);
    }
  }
  double sum = 0, L = 0;
  for (index_t j = 0; j < nj; ++j) {
    const float* vj = p.v.row(b, hk, J.begin + j);
    for (index_t k = 0; k < nk; ++k) {
      const auto at = static_cast<std::size_t>(j * nk + k);
      if (logit[at] >= m - 104.0) L = std::max(L, mag[at]);
      const double w = std::exp(logit[at] - m);
      sum += w;
      const float* vk = v2.row(b, hk, K.begin + k);
      for (index_t d = 0; d < dv; ++d) out_row[d] += w * static_cast<double>(vj[d]) * vk[d];
    }
  }
  for (index_t d = 0; d < dv; ++d) out_row[d] /= sum;
  if (logit_magnitude) *logit_magnitude = L;
  return m + std::log(sum);
}

}  // namespace numattn
