/// @file metrics.h
/// Error metrics against the float64 reference, named the same everywhere:
/// - `rel_fro_error`  = ‖Ô − O‖_F / ‖O‖_F   (0 when both are zero)
/// - `max_abs_error`  = max |Ô − O|
/// - `nmse`           = ‖Ô − O‖²_F / ‖O‖²_F  (ggml's normalised MSE)
/// - `lse_max_abs_error` = max |LSE^ − LSE| over rows (equal infinities count as 0)
/// - `max_scaled_error` = max |Ô − O| / max(1, |O|) (the elementwise policy of docs/numerics.md)
/// - `logit_magnitude` = L of the checked rows (reference.h), what tolerances scale with
///   (`exact_f32_tolerance`, `AccuracyContract`)
#pragma once

#include "numattn/attention/problem.h"
#include "numattn/attention/reference.h"

namespace numattn {

struct ErrorMetrics {
  double rel_fro_error = 0;
  double max_abs_error = 0;
  double nmse = 0;
  double lse_max_abs_error = 0;  ///< NaN when the method gave no LSE
  double max_scaled_error = 0;
  double logit_magnitude = 0;
  bool finite = true;            ///< no NaN/Inf in the output
  index_t rows_checked = 0;
};

/// Compares the method's `p.out` (and `p.lse` if present) with reference rows.
ErrorMetrics compare_with_reference(const AttentionProblem& p, const ReferenceRows& ref);

}  // namespace numattn
