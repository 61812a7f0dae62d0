#include "numattn/attention/blocks/lse_merge.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace numattn::blocks {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
}  // namespace

double lse_merge(const float* const* outs, const double* lses, int parts, std::int64_t dv, float* out) {
  double m = kNegInf;
  bool nan = false;
  for (int r = 0; r < parts; ++r) {
    if (std::isnan(lses[r])) nan = true;
    else m = std::max(m, lses[r]);
  }
  if (nan) {
    std::fill(out, out + dv, std::numeric_limits<float>::quiet_NaN());
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (m == kNegInf) {
    std::fill(out, out + dv, 0.0f);
    return kNegInf;
  }
  // m = +inf only when a partial overflowed: weights exp(l_r − m) would be NaN; keep the
  // overflowing parts equally weighted (their relative size is lost anyway).
  std::vector<double> w(static_cast<std::size_t>(parts), 0.0);
  double total = 0;
  for (int r = 0; r < parts; ++r) {
    if (lses[r] == kNegInf) continue;
    w[r] = std::isinf(m) ? (lses[r] == m ? 1.0 : 0.0) : std::exp(lses[r] - m);
    total += w[r];
  }
  // Accumulate in float64 before writing, because `out` may alias one of the inputs.
  std::vector<double> acc(static_cast<std::size_t>(dv), 0.0);
  for (int r = 0; r < parts; ++r) {
    if (w[r] == 0) continue;
    const double a = w[r] / total;
    for (std::int64_t c = 0; c < dv; ++c) acc[c] += a * outs[r][c];
  }
  for (std::int64_t c = 0; c < dv; ++c) out[c] = static_cast<float>(acc[c]);
  return m + std::log(total);
}

void lse_merge_into(float* acc, double& acc_lse, const float* o, double lse, std::int64_t dv) {
  if (lse == kNegInf && !std::isnan(acc_lse)) return;
  if (acc_lse == kNegInf && !std::isnan(lse)) {
    std::copy(o, o + dv, acc);
    acc_lse = lse;
    return;
  }
  if (std::isnan(acc_lse) || std::isnan(lse)) {
    std::fill(acc, acc + dv, std::numeric_limits<float>::quiet_NaN());
    acc_lse = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  const double m = std::max(acc_lse, lse);
  double wa, wb;
  if (std::isinf(m)) {  // an overflowed partial: see lse_merge
    wa = acc_lse == m ? 1.0 : 0.0;
    wb = lse == m ? 1.0 : 0.0;
  } else {
    wa = std::exp(acc_lse - m);
    wb = std::exp(lse - m);
  }
  const double t = wa + wb;
  const double a = wa / t, b = wb / t;
  for (std::int64_t c = 0; c < dv; ++c) acc[c] = static_cast<float>(a * acc[c] + b * o[c]);
  acc_lse = m + std::log(t);
}

}  // namespace numattn::blocks
