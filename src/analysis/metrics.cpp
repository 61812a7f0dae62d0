#include "numattn/analysis/metrics.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>
#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

ErrorMetrics compare_with_reference(const AttentionProblem& p, const ReferenceRows& ref) {
  ErrorMetrics m;
  const index_t dv = p.d_v();
  double num = 0, den = 0;
  bool have_lse = !p.lse.empty();
  m.lse_max_abs_error = have_lse ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  for (std::size_t t = 0; t < ref.rows.size(); ++t) {
    const RowIndex& r = ref.rows[t];
    const float* o = p.out.row(r.b, r.h, r.i);
    const double* e = ref.out.data() + t * static_cast<std::size_t>(dv);
    for (index_t d = 0; d < dv; ++d) {
      const double x = o[d], y = e[d];
      if (!std::isfinite(x)) m.finite = false;
      const double diff = std::abs(x - y);
      num += diff * diff;
      den += y * y;
      m.max_abs_error = std::max(m.max_abs_error, diff);
      m.max_scaled_error = std::max(m.max_scaled_error, diff / std::max(1.0, std::abs(y)));
    }
    if (have_lse) {
      const double x = p.lse(r.b, r.h, r.i, 0), y = ref.lse[t];
      double err;
      if (std::isnan(x)) err = std::numeric_limits<double>::infinity(), m.finite = false;
      else if (std::isinf(x) || std::isinf(y)) err = (x == y) ? 0.0 : std::numeric_limits<double>::infinity();
      else err = std::abs(x - y);
      m.lse_max_abs_error = std::max(m.lse_max_abs_error, err);
    }
  }
  if (!m.finite) {
    m.rel_fro_error = m.nmse = m.max_abs_error = std::numeric_limits<double>::infinity();
  } else if (den > 0) {
    m.nmse = num / den;
    m.rel_fro_error = std::sqrt(m.nmse);
  } else {
    m.nmse = m.rel_fro_error = (num > 0) ? std::numeric_limits<double>::infinity() : 0.0;
  }
  m.rows_checked = static_cast<index_t>(ref.rows.size());
  m.logit_magnitude = ref.logit_magnitude;
  return m;
}

namespace {

// Indices of the k largest entries of row[0..n) (NaN ranks last), as a sorted list.
template <class T>
std::vector<index_t> top_indices(const T* row, index_t n, index_t k) {
  std::vector<index_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), index_t{0});
  auto key = [&](index_t j) {
    const double x = static_cast<double>(row[j]);
    return std::isnan(x) ? -std::numeric_limits<double>::infinity() : x;
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](index_t a, index_t b) {
    const double x = key(a), y = key(b);
    return x > y || (x == y && a < b);
  });
  idx.resize(static_cast<std::size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

AttentionProbe::AttentionProbe(const AttentionProblem& p, index_t head) : nq_(p.n_q()), nk_(p.n_kv()) {
  const index_t d = p.d_qk();
  NUMATTN_CHECK(nk_ <= 8192, "the attention probe uses V = I ({} × {} floats): Nk ≤ 8192", nk_, nk_);
  NUMATTN_CHECK(head >= 0 && head < p.heads(), "the attention probe: head {} of {} query heads", head, p.heads());
  const index_t g = head / p.group();
  q_.resize(static_cast<std::size_t>(nq_ * d));
  k_.resize(static_cast<std::size_t>(nk_ * d));
  v_.assign(static_cast<std::size_t>(nk_ * nk_), 0.f);
  out_.resize(static_cast<std::size_t>(nq_ * nk_));
  for (index_t i = 0; i < nq_; ++i)
    for (index_t c = 0; c < d; ++c) q_[static_cast<std::size_t>(i * d + c)] = p.q(0, head, i, c);
  for (index_t j = 0; j < nk_; ++j) {
    for (index_t c = 0; c < d; ++c) k_[static_cast<std::size_t>(j * d + c)] = p.k(0, g, j, c);
    v_[static_cast<std::size_t>(j * nk_ + j)] = 1.f;
  }
  probe_.q = TensorView<const float>::contiguous(q_.data(), {1, 1, nq_, d});
  probe_.k = TensorView<const float>::contiguous(k_.data(), {1, 1, nk_, d});
  probe_.v = TensorView<const float>::contiguous(v_.data(), {1, 1, nk_, nk_});
  probe_.out = TensorView<float>::contiguous(out_.data(), {1, 1, nq_, nk_});
  probe_.scale = p.scale;
  probe_.causal = p.causal;
  probe_.mask = p.mask;
  probe_.window_left = p.window_left;
  probe_.window_right = p.window_right;
}

void AttentionProbe::run(const AttentionMethod& method, const ExecContext& ctx) {
  if (method.info().caps.lse) {
    lse_.resize(static_cast<std::size_t>(nq_));
    probe_.lse = TensorView<float>::contiguous(lse_.data(), {1, 1, nq_, 1});
  } else {
    probe_.lse = TensorView<float>();
  }
  method.run(probe_, ctx);
}

RecallMetrics topk_recall(const AttentionMethod& method, const AttentionProblem& p, index_t k,
                          index_t rows, std::uint64_t seed, const ExecContext& ctx) {
  NUMATTN_CHECK(k > 0, "top-k recall needs k > 0 (got {})", k);
  const index_t nk = p.n_kv();
  AttentionProbe pr(p, 0);
  pr.run(method, ctx);
  const AttentionProblem& probe = pr.problem();
  const ReferenceRows ref = reference_sample(probe, rows, seed, ctx);
  RecallMetrics m;
  m.k = k;
  double sum = 0;
  for (std::size_t t = 0; t < ref.rows.size(); ++t) {
    if (!(ref.lse[t] > -std::numeric_limits<double>::infinity())) continue;  // no visible key
    const double* exact = ref.out.data() + t * static_cast<std::size_t>(nk);
    index_t visible = 0;
    for (index_t j = 0; j < nk; ++j) visible += exact[j] > 0;
    const index_t kr = std::min(k, std::max<index_t>(visible, 1));
    const auto a = top_indices(exact, nk, kr);
    const auto b = top_indices(pr.row(ref.rows[t].i), nk, kr);
    std::vector<index_t> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    sum += static_cast<double>(both.size()) / static_cast<double>(kr);
    ++m.rows;
  }
  m.recall = m.rows > 0 ? sum / static_cast<double>(m.rows) : std::numeric_limits<double>::quiet_NaN();
  return m;
}

}  // namespace numattn
