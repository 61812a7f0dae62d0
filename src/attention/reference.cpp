#include "numattn/attention/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "attention/ordered_errors.h"
#include "numattn/attention/simplicial.h"
#include "numattn/core/rng.h"

namespace numattn {

namespace {
/// Weights below e^-104 of the row's largest are under float32's smallest subnormal (2^-149).
constexpr double kNegligibleLogitGap = 104.0;
}  // namespace

double reference_row(const AttentionProblem& p, index_t b, index_t h, index_t i, double* out_row,
                     double* logit_magnitude, const Target& target) {
  if (target.kind == TargetKind::kSimplicial)  // pairs of keys: its own oracle (simplicial.h)
    return simplicial_reference_row(p, p.k, p.v, target.window1, target.window2, b, h, i, out_row, logit_magnitude);
  const index_t dk = p.d_qk(), dv = p.d_v(), hk = h / p.group();
  const double scale = p.effective_scale();
  const double ninf = -std::numeric_limits<double>::infinity();
  const KeyRange r = p.key_range(i);
  std::fill(out_row, out_row + dv, 0.0);
  if (logit_magnitude) *logit_magnitude = 0;
  const auto nr = static_cast<std::size_t>(std::max<index_t>(r.end - r.begin, 0));
  // Per visible key: the exponent (exponential targets) or the weight without its mask factor
  // (the others), its magnitude for L, and the mask entry; hidden keys keep `visible` false.
  std::vector<double> s(nr, 0.0), mag(nr, 0.0), add(nr, 0.0);
  std::vector<char> visible(nr, 0);
  const bool exponential = target.kind == TargetKind::kSoftmax || target.kind == TargetKind::kGaussian;
  std::vector<float> q16;  // a half-precision q row, widened (exactly)
  if (p.has_half_q()) {
    q16.resize(static_cast<std::size_t>(dk));
    widen_row(p.q16_row(b, h, i), p.half_q.type, dk, q16.data());
  }
  const float* q = p.has_half_q() ? q16.data() : p.q.row(b, h, i);
  const MaskRow mrow = p.mask_row(b, h, i);
  std::vector<double> phi_q, phi_k;
  bool q_checked = false;
  double qq = 0;
  for (index_t j = r.begin; j < r.end; ++j) {
    if (mrow.allowed && !mrow.allowed[j]) continue;
    const auto at = static_cast<std::size_t>(j - r.begin);
    if (mrow.additive) {
      const float a = mrow.additive[j];
      if (!(a > -std::numeric_limits<float>::infinity())) continue;  // -inf or NaN: hidden
      if (std::isinf(a)) throw NonFiniteInput("mask", p.mask.shared() ? std::vector<index_t>{i, j} : std::vector<index_t>{b, h, i, j}, a);
      add[at] = a;
    }
    if (!q_checked) {
      check_finite_row("q", q, dk, {b, h, i});
      q_checked = true;
      for (index_t d = 0; d < dk; ++d) qq += static_cast<double>(q[d]) * q[d];
      if (target.kind == TargetKind::kFeatureMap) {
        std::vector<double> x(q, q + dk);
        phi_q.resize(static_cast<std::size_t>(target.feature_dim(dk)));
        phi_k.resize(phi_q.size());
        target.feature_map(x.data(), dk, scale, phi_q.data());
      }
    }
    const float* k = p.k.row(b, hk, j);
    check_finite_row("k", k, dk, {b, hk, j});
    visible[at] = 1;
    double dot = 0, absdot = 0, kk = 0;
    for (index_t d = 0; d < dk; ++d) {
      const double t = static_cast<double>(q[d]) * static_cast<double>(k[d]);
      dot += t;
      absdot += std::abs(t);
      kk += static_cast<double>(k[d]) * k[d];
    }
    switch (target.kind) {
      case TargetKind::kSoftmax:
        s[at] = scale * dot + add[at];
        mag[at] = std::abs(scale) * absdot + std::abs(add[at]);
        break;
      case TargetKind::kGaussian:  // −s‖q−k‖²/2; normalised, the −s‖q‖²/2 cancels
        s[at] = scale * (dot - 0.5 * kk - (target.normalised ? 0.0 : 0.5 * qq)) + add[at];
        mag[at] = std::abs(scale) * (absdot + 0.5 * kk + (target.normalised ? 0.0 : 0.5 * qq)) +
                  std::abs(add[at]);
        break;
      case TargetKind::kPolynomial:
        s[at] = std::pow(scale * dot, target.degree);
        mag[at] = target.degree * std::abs(scale) * absdot;  // compared with |s·q·k| below
        break;
      case TargetKind::kFeatureMap: {
        std::vector<double> x(k, k + dk);
        target.feature_map(x.data(), dk, scale, phi_k.data());
        double w = 0, aw = 0;
        for (std::size_t f = 0; f < phi_q.size(); ++f) {
          w += phi_q[f] * phi_k[f];
          aw += std::abs(phi_q[f] * phi_k[f]);
        }
        s[at] = w;
        mag[at] = aw;
        break;
      }
      case TargetKind::kSimplicial: break;  // handled above
    }
  }
  if (!q_checked) return ninf;
  double m = ninf;  // exponential targets: the largest exponent
  if (exponential)
    for (std::size_t at = 0; at < nr; ++at)
      if (visible[at]) m = std::max(m, s[at]);
  double sum = 0, L = 0, wmax = 0;
  for (index_t j = r.begin; j < r.end; ++j) {
    const auto at = static_cast<std::size_t>(j - r.begin);
    if (!visible[at]) continue;
    const float* v = p.v.row(b, hk, j);
    check_finite_row("v", v, dv, {b, hk, j});
    double w;
    if (exponential) {
      if (s[at] >= m - kNegligibleLogitGap) L = std::max(L, mag[at]);
      w = std::exp(s[at] - m);
    } else {
      w = s[at] * std::exp(add[at]);
      NUMATTN_CHECK(std::isfinite(w), "reference: the {} weight of query row [{},{},{}] and key {} "
                    "overflows float64", target.name(), b, h, i, j);
      L = std::max(L, mag[at]);
      wmax = std::max(wmax, std::abs(target.kind == TargetKind::kPolynomial
                                         ? std::pow(std::abs(s[at]), 1.0 / std::max(1, target.degree))
                                         : w));
    }
    sum += w;
    for (index_t d = 0; d < dv; ++d) out_row[d] += w * static_cast<double>(v[d]);
  }
  // Non-exponential targets: L is the relative condition of the weights, Σ|terms| over the
  // largest |weight| (for (s·q·k)^p: p·s·Σ|q_d k_d| over the largest |s·q·k|).
  if (!exponential) L = wmax > 0 ? L / wmax : 0;
  if (logit_magnitude) *logit_magnitude = L;
  if (exponential) {
    if (target.normalised) {
      for (index_t d = 0; d < dv; ++d) out_row[d] /= sum;
    } else {
      const double f = std::exp(m);
      for (index_t d = 0; d < dv; ++d) out_row[d] *= f;
    }
    return m + std::log(sum);
  }
  const double den = target.denominator_shift + sum;
  if (target.normalised) {
    for (index_t d = 0; d < dv; ++d) out_row[d] = den == 0 ? 0.0 : out_row[d] / den;
  }
  return den > 0 ? std::log(den) : ninf;
}

namespace {
ReferenceRows run_rows(const AttentionProblem& p, std::vector<RowIndex> rows, const ExecContext& ctx,
                       const Target& target) {
  ReferenceRows r;
  r.rows = std::move(rows);
  const index_t dv = p.d_v();
  const auto n = static_cast<std::int64_t>(r.rows.size());
  r.out.assign(r.rows.size() * static_cast<std::size_t>(dv), 0.0);
  r.lse.assign(r.rows.size(), 0.0);
  std::vector<double> L(r.rows.size(), 0.0);
  detail::parallel_for_ordered_errors(ctx, n, [&](std::int64_t t) {
    const RowIndex& ri = r.rows[static_cast<std::size_t>(t)];
    r.lse[static_cast<std::size_t>(t)] =
        reference_row(p, ri.b, ri.h, ri.i, r.out.data() + t * dv, &L[static_cast<std::size_t>(t)],
                      target);
  });
  for (double x : L) r.logit_magnitude = std::max(r.logit_magnitude, x);
  return r;
}
}  // namespace

ReferenceRows reference_rows(const AttentionProblem& p, std::vector<RowIndex> rows,
                             const ExecContext& ctx, const Target& target) {
  validate(p);
  for (const RowIndex& r : rows)
    NUMATTN_CHECK(r.b >= 0 && r.b < p.batch() && r.h >= 0 && r.h < p.heads() && r.i >= 0 && r.i < p.n_q(),
                  "reference_rows: row ({}, {}, {}) is outside the problem [{}, {}, {}]", r.b, r.h, r.i,
                  p.batch(), p.heads(), p.n_q());
  return run_rows(p, std::move(rows), ctx, target);
}

ReferenceRows reference_all(const AttentionProblem& p, const ExecContext& ctx, const Target& target) {
  validate(p);
  std::vector<RowIndex> rows;
  rows.reserve(static_cast<std::size_t>(p.batch() * p.heads() * p.n_q()));
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i) rows.push_back({b, h, i});
  return run_rows(p, std::move(rows), ctx, target);
}

ReferenceRows reference_sample(const AttentionProblem& p, index_t count, std::uint64_t seed,
                               const ExecContext& ctx, const Target& target) {
  validate(p);
  const index_t total = p.batch() * p.heads() * p.n_q();
  if (count >= total) return reference_all(p, ctx, target);
  // Partial Fisher–Yates driven by the counter RNG: the sample depends only on the seed.
  std::vector<index_t> idx(static_cast<std::size_t>(total));
  std::iota(idx.begin(), idx.end(), 0);
  CounterRng rng(seed, 0x5eedull);
  for (index_t t = 0; t < count; ++t) {
    index_t j = t + static_cast<index_t>(rng.uniform(static_cast<std::uint64_t>(t)) * (total - t));
    std::swap(idx[static_cast<std::size_t>(t)], idx[static_cast<std::size_t>(std::min(j, total - 1))]);
  }
  idx.resize(static_cast<std::size_t>(count));
  std::sort(idx.begin(), idx.end());
  std::vector<RowIndex> rows;
  for (index_t f : idx) {
    index_t i = f % p.n_q(), bh = f / p.n_q();
    rows.push_back({bh / p.heads(), bh % p.heads(), i});
  }
  return run_rows(p, std::move(rows), ctx, target);
}

}  // namespace numattn
