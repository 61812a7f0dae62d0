// The error budget of methods that attend each query row to a subset of the keys it sees and
// renormalise (sparse.window, sparse.topk): private header of the sparse family.
#pragma once

#include <algorithm>
#include <cmath>

#include "numattn/attention/accuracy.h"
#include "numattn/attention/method.h"

namespace numattn::sparse_detail {

/// `kept(i, r)`: how many of row i's visible keys `r` (causal rule and window, problem.h) the
/// method attends to. Rows that keep all of them are exact; otherwise the row's output is the
/// softmax average over the kept keys instead of all visible ones. For a row whose weight is
/// spread evenly over n keys of which c are kept, that is the mean of c values against the mean
/// of n, off by about sqrt(n/c − 1) relative to the output (whose norm is ~ ‖v‖/sqrt(n)); a
/// peaked row whose heavy key is dropped is off by about ‖v_a − v_b‖/‖v_a‖ ≲ 1.5. The budget is
/// that envelope at the worst row, `a + b·sqrt(n/c − 1)`, with (a, b) calibrated by the caller
/// on the conformance matrix with a margin of at least 2 (a promise, not a theorem).
template <class Kept>
double kept_keys_budget(const BudgetInput& in, double a, double b, Kept kept) {
  const AttentionProblem& p = in.problem;
  const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  double worst = 1;  // max over rows of n / c
  for (index_t i = 0; i < p.n_q(); ++i) {
    const KeyRange r = p.key_range(i);
    const index_t n = r.end - r.begin;
    if (n <= 0) continue;
    const index_t c = std::min(n, kept(i, r));
    if (c < n) worst = std::max(worst, static_cast<double>(n) / static_cast<double>(std::max<index_t>(c, 1)));
  }
  if (worst <= 1) return exact;
  return exact + a + b * std::sqrt(worst - 1);
}

}  // namespace numattn::sparse_detail
