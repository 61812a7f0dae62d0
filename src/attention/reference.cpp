#include "numattn/attention/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "attention/ordered_errors.h"
#include "numattn/core/rng.h"

namespace numattn {

namespace {
/// Weights below e^-104 of the row's largest are under float32's smallest subnormal (2^-149).
constexpr double kNegligibleLogitGap = 104.0;
}  // namespace

double reference_row(const AttentionProblem& p, index_t b, index_t h, index_t i, double* out_row,
                     double* logit_magnitude) {
  const index_t dk = p.d_qk(), dv = p.d_v(), hk = h / p.group();
  const double scale = p.effective_scale();
  const double ninf = -std::numeric_limits<double>::infinity();
  const KeyRange r = p.key_range(i);
  std::fill(out_row, out_row + dv, 0.0);
  if (logit_magnitude) *logit_magnitude = 0;
  const auto nr = static_cast<std::size_t>(std::max<index_t>(r.end - r.begin, 0));
  std::vector<double> s(nr, ninf), mag(nr, 0.0);
  const float* q = p.q.row(b, h, i);
  bool q_checked = false;
  double m = ninf;
  for (index_t j = r.begin; j < r.end; ++j) {
    if (p.mask.kind == MaskKind::kBool && !p.mask.allowed[i * p.mask.ld + j]) continue;
    double add = 0;
    if (p.mask.kind == MaskKind::kAdditive) {
      const float a = p.mask.additive[i * p.mask.ld + j];
      if (!(a > -std::numeric_limits<float>::infinity())) continue;  // -inf or NaN: hidden
      if (std::isinf(a)) throw NonFiniteInput("mask", {i, j}, a);
      add = a;
    }
    if (!q_checked) check_finite_row("q", q, dk, {b, h, i}), q_checked = true;
    const float* k = p.k.row(b, hk, j);
    check_finite_row("k", k, dk, {b, hk, j});
    double dot = 0, absdot = 0;
    for (index_t d = 0; d < dk; ++d) {
      const double t = static_cast<double>(q[d]) * static_cast<double>(k[d]);
      dot += t;
      absdot += std::abs(t);
    }
    const auto at = static_cast<std::size_t>(j - r.begin);
    s[at] = scale * dot + add;
    mag[at] = std::abs(scale) * absdot + std::abs(add);
    m = std::max(m, s[at]);
  }
  if (m == ninf) return ninf;
  double sum = 0, L = 0;
  for (index_t j = r.begin; j < r.end; ++j) {
    const auto at = static_cast<std::size_t>(j - r.begin);
    const double x = s[at];
    if (x == ninf) continue;
    const float* v = p.v.row(b, hk, j);
    check_finite_row("v", v, dv, {b, hk, j});
    if (x >= m - kNegligibleLogitGap) L = std::max(L, mag[at]);
    const double w = std::exp(x - m);
    sum += w;
    for (index_t d = 0; d < dv; ++d) out_row[d] += w * static_cast<double>(v[d]);
  }
  for (index_t d = 0; d < dv; ++d) out_row[d] /= sum;
  if (logit_magnitude) *logit_magnitude = L;
  return m + std::log(sum);
}

namespace {
ReferenceRows run_rows(const AttentionProblem& p, std::vector<RowIndex> rows, const ExecContext& ctx) {
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
        reference_row(p, ri.b, ri.h, ri.i, r.out.data() + t * dv, &L[static_cast<std::size_t>(t)]);
  });
  for (double x : L) r.logit_magnitude = std::max(r.logit_magnitude, x);
  return r;
}
}  // namespace

ReferenceRows reference_all(const AttentionProblem& p, const ExecContext& ctx) {
  validate(p);
  std::vector<RowIndex> rows;
  rows.reserve(static_cast<std::size_t>(p.batch() * p.heads() * p.n_q()));
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i) rows.push_back({b, h, i});
  return run_rows(p, std::move(rows), ctx);
}

ReferenceRows reference_sample(const AttentionProblem& p, index_t count, std::uint64_t seed,
                               const ExecContext& ctx) {
  validate(p);
  const index_t total = p.batch() * p.heads() * p.n_q();
  if (count >= total) return reference_all(p, ctx);
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
  return run_rows(p, std::move(rows), ctx);
}

}  // namespace numattn
