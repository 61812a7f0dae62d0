#include "numattn/decomp/rpcholesky.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"

namespace numattn::decomp {

RpCholeskyResult rp_cholesky(index_t n, std::span<const double> diag, const PsdColumnFn& column,
                             const RpCholeskyOptions& opt) {
  NUMATTN_CHECK(n >= 0 && static_cast<index_t>(diag.size()) == n,
                "rp_cholesky: the diagonal has {} entries for an {}×{} matrix", diag.size(), n, n);
  NUMATTN_CHECK(opt.rank >= 0, "rp_cholesky: rank must be ≥ 0 (got {})", opt.rank);
  NUMATTN_CHECK(opt.log_weight.empty() || static_cast<index_t>(opt.log_weight.size()) == n,
                "rp_cholesky: log_weight has {} entries, expected {}", opt.log_weight.size(), n);
  const auto sz = static_cast<std::size_t>(n);
  // Sampling weights exp(w − max w) ≤ 1: the weighted residual diagonal without overflow.
  std::vector<double> wt(sz, 1.0);
  if (!opt.log_weight.empty()) {
    double wmax = -std::numeric_limits<double>::infinity();
    for (double w : opt.log_weight) {
      NUMATTN_CHECK(std::isfinite(w), "rp_cholesky: log_weight entries must be finite (got {})", w);
      wmax = std::max(wmax, w);
    }
    for (std::size_t i = 0; i < sz; ++i) wt[i] = std::exp(opt.log_weight[i] - wmax);
  }
  std::vector<double> d(diag.begin(), diag.end());
  for (std::size_t i = 0; i < sz; ++i)
    NUMATTN_CHECK(std::isfinite(d[i]) && d[i] >= 0,
                  "rp_cholesky: diagonal entry {} is {}; a PSD matrix has a finite, non-negative diagonal", i, d[i]);
  const auto weighted_trace = [&] {
    double t = 0;
    for (std::size_t i = 0; i < sz; ++i) t += wt[i] * d[i];
    return t;
  };

  RpCholeskyResult res;
  const index_t r = std::min(opt.rank, n);
  res.factor.resize(n, r);
  res.initial_trace = weighted_trace();
  const CounterRng rng(opt.seed, opt.stream);
  std::vector<double> g(sz);
  index_t k = 0;
  for (; k < r; ++k) {
    const double total = weighted_trace();
    if (!(total > opt.rel_tol * res.initial_trace) || !(total > 0)) break;
    // Inverse-CDF draw of s with P(s = i) = wt_i·d_i / total (d_s > 0 for the chosen s).
    const double u = rng.uniform(static_cast<std::uint64_t>(k)) * total;
    index_t s = -1;
    double acc = 0;
    for (index_t i = 0; i < n; ++i) {
      const double p = wt[static_cast<std::size_t>(i)] * d[static_cast<std::size_t>(i)];
      if (p <= 0) continue;
      s = i;  // the last positive one catches u at the rounding edge of the total
      acc += p;
      if (acc > u) break;
    }
    NUMATTN_ASSERT(s >= 0);
    column(s, g.data());
    Eigen::Map<Eigen::VectorXd> gv(g.data(), n);
    if (k > 0) gv.noalias() -= res.factor.leftCols(k) * res.factor.row(s).head(k).transpose();
    const double gs = g[static_cast<std::size_t>(s)];
    // A pivot whose residual is rounding noise relative to its own diagonal entry would divide
    // by that noise: the matrix is exhausted to working precision.
    if (!(gs > 16 * std::numeric_limits<double>::epsilon() * diag[static_cast<std::size_t>(s)]) || !(gs > 0)) break;
    res.factor.col(k) = gv / std::sqrt(gs);
    for (std::size_t i = 0; i < sz; ++i) {
      const double f = res.factor(static_cast<index_t>(i), k);
      d[i] = std::max(d[i] - f * f, 0.0);
    }
    d[static_cast<std::size_t>(s)] = 0;
    res.pivots.push_back(s);
  }
  res.early_stop = k < opt.rank;
  res.factor.conservativeResize(n, k);
  res.residual_diag = d;
  res.residual_trace = weighted_trace();
  return res;
}

}  // namespace numattn::decomp
