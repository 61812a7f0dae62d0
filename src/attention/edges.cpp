#include "attention/edges.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "attention/ordered_errors.h"
#include "numattn/attention/reference.h"
#include "numattn/core/simd.h"

namespace numattn::detail {

namespace {

constexpr double kF32Max = std::numeric_limits<float>::max();
// Rounding can lift a computed partial sum above the bound of its exact terms by (1 + ε)^n,
// under 1.13 for n ≤ 10^6 terms: half of FLT_MAX leaves room for it.
constexpr double kSafeLimit = kF32Max / 2;

/// Over every key of one (batch, kv head), hidden or not: float32 kernels compute logits and
/// weighted sums over whole tiles and mask afterwards, so a hidden key can still overflow them.
struct HeadStats {
  double k_norm_max = 0;  ///< max_j ‖k_j‖₂
  double v_abs_max = 0;   ///< max |v_jd|
  bool nonfinite = false;
};

HeadStats head_stats(const AttentionProblem& p, index_t b, index_t hk) {
  HeadStats s;
  for (index_t j = 0; j < p.n_kv(); ++j) {
    const float* k = p.k.row(b, hk, j);
    const float* v = p.v.row(b, hk, j);
    double n2 = 0;
    for (index_t d = 0; d < p.d_qk(); ++d) n2 += static_cast<double>(k[d]) * k[d];
    for (index_t d = 0; d < p.d_v(); ++d) s.v_abs_max = std::max(s.v_abs_max, std::abs(static_cast<double>(v[d])));
    s.k_norm_max = std::max(s.k_norm_max, std::sqrt(n2));
    s.nonfinite |= !std::isfinite(n2) || !std::isfinite(s.v_abs_max);
  }
  return s;
}

/// Magnitude bounds of everything a float32 kernel computes for one query row.
struct RowBounds {
  double logit = 0;   ///< max(1, |scale|)·‖q‖·max‖k‖ + max|mask|: logits and their partial sums
  double qscale = 0;  ///< |scale|·max|q_d| (a kernel may fold the scale into q)
  double values = 0;  ///< Nk·max|v|: unnormalised weights are ≤ 1, so weighted sums of v stay below
  bool nonfinite = false;  ///< a value the row does not see, but a kernel may read, is not finite
  bool in_range() const { return !nonfinite && std::max({logit, qscale, values}) <= kSafeLimit; }
};

RowBounds row_bounds(const AttentionProblem& p, const HeadStats& hs, index_t b, index_t h, index_t i) {
  RowBounds r;
  const float* q = p.q.row(b, h, i);
  double qn2 = 0, qmax = 0;
  for (index_t d = 0; d < p.d_qk(); ++d) {
    qn2 += static_cast<double>(q[d]) * q[d];
    qmax = std::max(qmax, std::abs(static_cast<double>(q[d])));
  }
  double mask_max = 0;
  if (p.mask.kind == MaskKind::kAdditive)
    for (index_t j = 0; j < p.n_kv(); ++j) {
      const double a = p.mask_row(b, h, i).additive[j];
      if (std::isfinite(a)) mask_max = std::max(mask_max, std::abs(a));
      else r.nonfinite |= a > 0;  // NaN and -inf hide keys; +inf hidden by the causal rule or window
    }
  const double scale = std::abs(p.effective_scale());
  r.logit = std::max(1.0, scale) * std::sqrt(qn2) * hs.k_norm_max + mask_max;
  r.qscale = scale * qmax;
  r.values = static_cast<double>(p.n_kv()) * hs.v_abs_max;
  r.nonfinite |= hs.nonfinite || !std::isfinite(qn2);
  return r;
}

std::string row_name(index_t b, index_t h, index_t i) {
  return fmt::format("query row [b,h,i] = [{},{},{}]", b, h, i);
}

bool row_finite(const AttentionProblem& p, index_t b, index_t h, index_t i, std::vector<float>& row) {
  if (p.has_half_out()) {
    row.resize(static_cast<std::size_t>(p.d_v()));
    widen_row(p.out16_row(b, h, i), p.half_out.type, p.d_v(), row.data());
    if (!simd::all_finite(row.data(), p.d_v())) return false;
  } else if (!simd::all_finite(p.out.row(b, h, i), p.d_v())) {
    return false;
  }
  if (p.lse.empty()) return true;
  const float l = p.lse(b, h, i, 0);
  return !std::isnan(l) && l != std::numeric_limits<float>::infinity();  // -inf: no visible key
}

}  // namespace

void settle_nonfinite_rows(const AttentionMethod& m, const AttentionProblem& p, const ExecContext& ctx) {
  std::vector<RowIndex> bad;
  std::vector<float> row;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i)
        if (!row_finite(p, b, h, i, row)) bad.push_back({b, h, i});
  if (bad.empty()) return;
  if (p.has_half_q() || p.has_half_out()) {  // the float64 trace reads float32 rows: the same problem, widened
    const WidenedIo w = widen_io(p);
    settle_nonfinite_rows(m, w.problem, ctx);
    w.store_out(p);
    return;
  }
  if (p.half_kv()) {
    const WidenedKv w = widen_kv(p);
    return settle_nonfinite_rows(m, w.problem, ctx);
  }

  std::map<std::pair<index_t, index_t>, HeadStats> heads;
  for (const RowIndex& r : bad) heads[{r.b, r.h / p.group()}];
  std::vector<std::pair<index_t, index_t>> keys;
  for (const auto& kv : heads) keys.push_back(kv.first);
  parallel_for(ctx, static_cast<std::int64_t>(keys.size()), [&](std::int64_t t) {
    const auto& key = keys[static_cast<std::size_t>(t)];
    heads.at(key) = head_stats(p, key.first, key.second);
  });

  const index_t dv = p.d_v();
  const bool exact = m.info().caps.exact;
  parallel_for_ordered_errors(ctx, static_cast<std::int64_t>(bad.size()), [&](std::int64_t t) {
    const RowIndex r = bad[static_cast<std::size_t>(t)];
    std::vector<double> o(static_cast<std::size_t>(dv));
    const double lse = reference_row(p, r.b, r.h, r.i, o.data());
    // lse is -inf for a row that sees no key (flagged only for garbage in keys it does not see).
    NUMATTN_CHECK(p.lse.empty() || lse == -std::numeric_limits<double>::infinity() || std::abs(lse) <= kF32Max,
                  "{}: the log-sum-exp of {} is {:.4g}, beyond the float32 range of the lse output "
                  "(±{:.4g}); reduce the scale or the magnitude of q and k, or do not request the LSE",
                  m.spec(), row_name(r.b, r.h, r.i), lse, kF32Max);
    const RowBounds rb = row_bounds(p, heads.at({r.b, r.h / p.group()}), r.b, r.h, r.i);
    const std::string bounds = fmt::format(
        "logits up to max(1,|scale|)·‖q‖·max‖k‖ + max|mask| = {:.3g}, |scale|·max|q| = {:.3g}, "
        "weighted sums of v up to Nk·max|v| = {:.3g}{}; float32 kernels need them within {:.3g}",
        rb.logit, rb.qscale, rb.values, rb.nonfinite ? ", non-finite values in keys it does not see" : "",
        kSafeLimit);
    NUMATTN_CHECK(!rb.in_range(),
                  "internal error: {} returned a non-finite value in {} although every input it "
                  "reads is finite and within float32 range ({}); this is a bug in the method",
                  m.spec(), row_name(r.b, r.h, r.i), bounds);
    NUMATTN_CHECK(exact,
                  "{} cannot compute {} in float32 ({}); it has no float64 path (exact methods do)",
                  m.spec(), row_name(r.b, r.h, r.i), bounds);
    float* dst = p.out.row(r.b, r.h, r.i);
    for (index_t d = 0; d < dv; ++d) dst[d] = static_cast<float>(o[static_cast<std::size_t>(d)]);
    if (!p.lse.empty()) p.lse(r.b, r.h, r.i, 0) = static_cast<float>(lse);
  });
}

}  // namespace numattn::detail
