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

#include <cstdint>

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

class AttentionMethod;

/// Top-k recall of the attention rows a method forms, for any method: the method runs on a probe
/// problem with the first query head of `p` (batch 0), its KV head, and V = I (Nk × Nk), so its
/// output row i *is* its effective attention row P̂_i; the float64 reference on the same probe
/// gives the exact row P_i. For `rows` sampled query rows (seeded), recall = |top-k(P̂_i) ∩
/// top-k(P_i)| / k, averaged (k shrinks to the number of visible keys of a row; rows with no
/// visible key are skipped; a NaN weight ranks last). Causal rule, window, mask and scale of `p`
/// apply. Methods whose choices depend on V (e.g. a sampling distribution from value norms) are
/// measured with unit value rows. Cost: one run at Dv = Nk and `rows`·Nk·(Dk + Nk) in float64;
/// refuses (`Error`) Nk > 8192 (the probe is Nq·Nk floats) and methods that cannot run the probe.
struct RecallMetrics {
  double recall = 0;      ///< mean over the counted rows
  index_t k = 0;          ///< the requested k
  index_t rows = 0;       ///< rows counted
};
RecallMetrics topk_recall(const AttentionMethod& method, const AttentionProblem& p, index_t k,
                          index_t rows, std::uint64_t seed, const ExecContext& ctx);

}  // namespace numattn
