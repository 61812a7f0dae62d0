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
#include <vector>

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

/// The attention matrix P̂ a method forms on one query head, for any method: the method runs on
/// a probe problem with query head `head` of batch 0 of `p`, its KV head, and V = I (Nk × Nk), so
/// that output row i *is* the method's effective attention row P̂_i (for methods whose choices do
/// not depend on V; one that samples by value norms sees unit value rows). Causal rule, window,
/// mask and scale of `p` apply. Cost: one run at Dv = Nk; Nq·Nk floats. Refuses (`Error`)
/// Nk > 8192 and, through `run`, methods that cannot run the probe.
class AttentionProbe {
 public:
  AttentionProbe(const AttentionProblem& p, index_t head);
  AttentionProbe(const AttentionProbe&) = delete;
  AttentionProbe& operator=(const AttentionProbe&) = delete;
  /// The probe problem ([1, 1, Nq, Dk] queries, [1, 1, Nk, Nk] identity values).
  const AttentionProblem& problem() const { return probe_; }
  /// Runs `method` (validate, can_run, forward: AttentionMethod::run) and keeps its P̂.
  void run(const AttentionMethod& method, const ExecContext& ctx);
  /// Row i of P̂ (Nk floats), after run.
  const float* row(index_t i) const { return out_.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(nk_); }

 private:
  index_t nq_ = 0, nk_ = 0;
  std::vector<float> q_, k_, v_, out_, lse_;
  AttentionProblem probe_;
};

/// Top-k recall of the attention rows a method forms, for any method: P̂ from an AttentionProbe of
/// the first query head of `p`; the float64 reference on the same probe gives the exact row P_i. For `rows` sampled query rows (seeded), recall = |top-k(P̂_i) ∩
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
