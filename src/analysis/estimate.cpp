#include "numattn/analysis/estimate.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"

namespace numattn {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// P(|T| ≤ t) for Student's t with integer dof ν (A&S 26.7.3 odd ν, 26.7.4 even ν): with
// θ = atan(t/√ν), a finite series in cos²θ whose terms shrink by (k/(k+1))·cos²θ.
double t_two_sided(double t, index_t nu) {
  const double th = std::atan(t / std::sqrt(static_cast<double>(nu)));
  const double s = std::sin(th), c2 = std::cos(th) * std::cos(th);
  if (nu % 2 == 0) {
    double term = 1, sum = 1;
    for (index_t k = 2; k <= nu - 2; k += 2) {
      term *= c2 * static_cast<double>(k - 1) / static_cast<double>(k);
      sum += term;
    }
    return s * sum;
  }
  if (nu == 1) return 2 * th / std::numbers::pi;
  double term = std::cos(th), sum = term;
  for (index_t k = 3; k <= nu - 2; k += 2) {
    term *= c2 * static_cast<double>(k - 1) / static_cast<double>(k);
    sum += term;
  }
  return 2 / std::numbers::pi * (th + s * sum);
}

// Distinct indices of `count` draws from [0, n) (partial Fisher–Yates on the counter RNG).
std::vector<index_t> choose(index_t n, index_t count, const CounterRng& rng, std::uint64_t& ctr) {
  std::vector<index_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  for (index_t t = 0; t < count; ++t) {
    const index_t j = std::min(n - 1, t + static_cast<index_t>(rng.uniform(ctr++) * static_cast<double>(n - t)));
    std::swap(idx[static_cast<std::size_t>(t)], idx[static_cast<std::size_t>(j)]);
  }
  idx.resize(static_cast<std::size_t>(count));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

double student_t_quantile(double prob, index_t dof) {
  NUMATTN_CHECK(prob > 0 && prob < 1, "student_t_quantile: probability {} is outside (0, 1)", prob);
  NUMATTN_CHECK(dof >= 1, "student_t_quantile: {} degrees of freedom (need >= 1)", dof);
  if (prob < 0.5) return -student_t_quantile(1 - prob, dof);
  const double target = 2 * prob - 1;  // P(|T| ≤ t)
  double lo = 0, hi = 1;
  while (t_two_sided(hi, dof) < target && hi < 1e300) hi *= 2;
  while (hi - lo > 1e-12 * std::max(1.0, hi)) {
    const double mid = 0.5 * (lo + hi);
    (t_two_sided(mid, dof) < target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

index_t auto_estimate_rows(const AttentionProblem& p) {
  const double rows = static_cast<double>(p.batch() * p.heads() * p.n_q());
  return std::max<index_t>(32, static_cast<index_t>(std::ceil(std::sqrt(rows))));
}

std::vector<WeightedRow> stratified_rows(const AttentionProblem& p, index_t m, std::uint64_t seed) {
  NUMATTN_CHECK(m >= 0, "error estimate: {} rows requested (need >= 1, or 0 for automatic)", m);
  if (m == 0) m = auto_estimate_rows(p);
  const index_t S = p.batch() * p.heads(), nq = p.n_q();
  std::vector<WeightedRow> out;
  if (S * nq == 0) return out;
  if (m >= S * nq) {  // every row: the estimate is the error itself
    for (index_t s = 0; s < S; ++s)
      for (index_t i = 0; i < nq; ++i) out.push_back({{s / p.heads(), s % p.heads(), i}, 1.0});
    return out;
  }
  const CounterRng rng(seed, 0xe571a7eull);
  std::uint64_t ctr = 0;
  // Rows per stratum: m_s, and the factor by which a sampled stratum stands for the unsampled.
  std::vector<index_t> per(static_cast<std::size_t>(S), m / S);
  for (index_t s : choose(S, m % S, rng, ctr)) ++per[static_cast<std::size_t>(s)];
  const double strata_factor = m >= S ? 1.0 : static_cast<double>(S) / static_cast<double>(m);
  // Rows where the number of visible keys reaches the next power of two (a causal rule, a
  // window): an approximation's row error depends on how many keys the row sees against the
  // method's budget, and under a causal rule that count spans orders of magnitude inside the
  // first position segment, where the error of a top-k or low-rank method concentrates.
  auto visible_class = [&](index_t r) -> index_t {  // ⌊log2(visible keys)⌋ + 1, 0 for none
    const KeyRange kr = p.key_range(r);
    return kr.empty() ? 0 : static_cast<index_t>(std::bit_width(static_cast<std::uint64_t>(kr.end - kr.begin)));
  };
  std::vector<index_t> doubling;  // ascending row indices in (0, Nq/2]
  for (index_t i = 1, prev = visible_class(0); i <= nq / 2; ++i) {
    const index_t c = visible_class(i);
    if (c != prev) doubling.push_back(i);
    prev = c;
  }
  for (index_t s = 0; s < S; ++s) {
    const index_t ms = per[static_cast<std::size_t>(s)];
    if (ms == 0) continue;  // a stratum not sampled (fewer rows than strata)
    std::vector<index_t> bounds;
    for (index_t j = 0; j <= ms; ++j) bounds.push_back(j * nq / ms);
    // With two or more rows a stratum also splits its first segment where the visible key count
    // doubles (one row from each part): the geometric refinement above.
    if (ms >= 2)
      for (index_t b : doubling)
        if (b < bounds[1]) bounds.push_back(b);
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
    for (std::size_t j = 0; j + 1 < bounds.size(); ++j) {
      const index_t lo = bounds[j], hi = bounds[j + 1];
      const index_t i = std::min(hi - 1, lo + static_cast<index_t>(rng.uniform(ctr++) * static_cast<double>(hi - lo)));
      out.push_back({{s / p.heads(), s % p.heads(), i}, static_cast<double>(hi - lo) * strata_factor});
    }
  }
  return out;
}

ErrorEstimate ratio_estimate(std::span<const double> e, std::span<const double> n,
                             std::span<const double> w, index_t population, double level) {
  NUMATTN_CHECK(e.size() == n.size() && e.size() == w.size(), "ratio_estimate: lengths differ ({}, {}, {})",
                e.size(), n.size(), w.size());
  NUMATTN_CHECK(level > 0.5 && level < 1, "error estimate: level {} is outside (0.5, 1)", level);
  ErrorEstimate r;
  r.level = level;
  r.rows = static_cast<index_t>(e.size());
  double se = 0, sn = 0;
  bool finite = true;
  for (std::size_t k = 0; k < e.size(); ++k) {
    finite = finite && std::isfinite(e[k]);
    se += w[k] * e[k];
    sn += w[k] * n[k];
    r.zero_norm_rows += n[k] == 0;
  }
  if (!finite) {
    r.rel_error = r.rel_error_hi = kNaN;
    return r;
  }
  if (sn <= 0) {  // every sampled reference row is zero
    r.rel_error = r.rel_error_hi = se > 0 ? kInf : 0.0;
    return r;
  }
  const double R = se / sn;
  r.rel_error = std::sqrt(R);
  const auto m = static_cast<index_t>(e.size());
  if (m >= population) {
    r.rel_error_hi = r.rel_error;
    return r;
  }
  if (m < 2) {
    r.rel_error_hi = kInf;
    return r;
  }
  // Fieller's interval for a ratio of two estimated totals: A_r = m·w_r·e_r and B_r = m·w_r·n_r
  // are the per-draw (Hansen–Hurwitz) estimates of Σe and Σn, with means Ê = Σ w e, N̂ = Σ w n;
  // R lies under the bound iff Ê − R·N̂ ≥ −t·sqrt(v(Ê − R·N̂)), the larger root of
  //   (N̂² − t²v_BB)·R² − 2(Ê·N̂ − t²v_AB)·R + (Ê² − t²v_AA) = 0.
  const double md = static_cast<double>(m);
  double saa = 0, sbb = 0, sab = 0;
  for (std::size_t k = 0; k < e.size(); ++k) {
    const double da = md * w[k] * e[k] - se, db = md * w[k] * n[k] - sn;
    saa += da * da;
    sbb += db * db;
    sab += da * db;
  }
  const double fpc = 1 - md / static_cast<double>(population);
  const double scale = fpc / (md * (md - 1));  // v = fpc · s²/m with s² = Σ d²/(m − 1)
  const double t = student_t_quantile(level, m - 1), t2 = t * t;
  const double qa = sn * sn - t2 * scale * sbb, qb = se * sn - t2 * scale * sab, qc = se * se - t2 * scale * saa;
  // R̂ itself satisfies the inequality, so with qa > 0 the roots are real: a negative
  // discriminant is rounding.
  const double disc = std::max(0.0, qb * qb - qa * qc);
  // The denominator not significantly above zero (qa ≤ 0): no finite bound at this level.
  r.rel_error_hi = qa > 0 ? std::sqrt(std::max(R, (qb + std::sqrt(disc)) / qa)) : kInf;
  return r;
}

EstimateSample draw_estimate_sample(const AttentionProblem& p, index_t rows, std::uint64_t seed,
                                    const ExecContext& ctx) {
  EstimateSample s;
  s.design = stratified_rows(p, rows, seed);
  std::vector<RowIndex> r;
  for (const WeightedRow& x : s.design) r.push_back(x.row);
  s.ref = reference_rows(p, std::move(r), ctx);
  return s;
}

ErrorEstimate estimate_error(const AttentionProblem& p, const EstimateSample& s, double level) {
  const index_t dv = p.d_v();
  const std::size_t m = s.design.size();
  std::vector<double> e(m, 0.0), n(m, 0.0), w(m);
  for (std::size_t t = 0; t < m; ++t) {
    const RowIndex& r = s.design[t].row;
    w[t] = s.design[t].weight;
    const float* o = p.out.row(r.b, r.h, r.i);
    const double* y = s.ref.out.data() + t * static_cast<std::size_t>(dv);
    for (index_t d = 0; d < dv; ++d) {
      const double diff = static_cast<double>(o[d]) - y[d];
      e[t] += diff * diff;
      n[t] += y[d] * y[d];
    }
  }
  ErrorEstimate est = ratio_estimate(e, n, w, p.batch() * p.heads() * p.n_q(), level);
  est.logit_magnitude = s.ref.logit_magnitude;
  return est;
}

ErrorEstimate estimate_error(const AttentionProblem& p, const ErrorEstimateOptions& opt,
                             const ExecContext& ctx) {
  NUMATTN_CHECK(opt.level > 0.5 && opt.level < 1, "error estimate: level {} is outside (0.5, 1)", opt.level);
  return estimate_error(p, draw_estimate_sample(p, opt.rows, opt.seed, ctx), opt.level);
}

}  // namespace numattn
