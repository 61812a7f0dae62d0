#include "numattn/analysis/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

}  // namespace numattn
