/// @file predict.h
/// Error prediction from the structure of P (`numattn analyze --predict`, docs/analysis.md):
/// what the best method of a given budget can reach on one head, against what a registered
/// method reaches.
///
/// Two budgets, two lower bounds, each on the softmax matrix P itself (an approximation's error
/// on the output P·V can be smaller, V may hide it, so no bound on the output exists):
/// - rank r (low-rank methods): by Eckart–Young no P̂ of rank ≤ r has
///   ‖P̂ − P‖_F/‖P‖_F < tail_rel_fro(σ(P), r) = sqrt(Σ_{i>r} σ_i²/Σ σ_i²).
///   Metric "rel_fro_P". lowrank.svd(rank=r) attains it; lowrank.nystrom(landmarks=m) has rank ≤ m
///   (its P̂ = F₁·pinv(F₂)·F₃ factors through m landmarks).
/// - k_i keys in row i (sparse methods): a row P̂_i with at most k_i nonzeros loses the mass of
///   P_i outside them, so ‖P̂_i − P_i‖_1 ≥ 1 − (mass of the k_i largest P_ij). Metric
///   "mean_row_l1_P": the mean over rows of ‖P̂_i − P_i‖_1 (twice the mean total-variation
///   distance), bounded below by the mean of 1 − topk mass. sparse.topk(k) keeps min(k, visible)
///   keys and renormalises, which gives exactly twice the bound; lowrank.loki keeps
///   ceil(topk_frac·visible) keys; sparse.window(left, sinks) keeps the band and the sinks.
/// The budget of each method is its declared parameter (below), so the prediction is made from
/// P alone, before the method runs; the measured P̂ comes from an AttentionProbe (metrics.h).
///
/// Sliding window. On a layer with a window of W keys (spectra.h) P is the windowed matrix, the
/// methods run on the problem the layer computes (window_left = W − 1), the keys-per-row budgets
/// count the window's keys (sparse.window's band is narrowed to it and its sinks count only inside
/// it), and both the bound and the measured error use the windowed P. A method that cannot run a
/// window (its can_run refuses; lowrank.nystrom, which is also non-causal) is reported as skipped
/// for that head, not measured. A window of W ≥ Nk keys hides nothing and counts as none.
#pragma once

#include <string>
#include <vector>

#include "numattn/analysis/spectra.h"
#include "numattn/attention/method.h"

namespace numattn::analysis {

/// How a method's budget bounds its error.
enum class BudgetKind { kRank, kKeysPerRow };

/// The budget a registered method declares through its parameters, for the methods whose P̂ is
/// provably of bounded rank or support: lowrank.svd (rank), lowrank.nystrom (landmarks),
/// sparse.topk (k), lowrank.loki (topk_frac), sparse.window (left, sinks). Throws
/// numattn::Error naming these for any other method.
struct Budget {
  BudgetKind kind = BudgetKind::kRank;
  std::string param;      ///< "rank=8", "k=32", "topk_frac=0.25", "left=32,sinks=4"
  std::int64_t rank = 0;  ///< kRank
  /// kKeysPerRow: the most keys row i may keep (Nq values), for `visible` keys per row.
  std::vector<std::int64_t> keys_per_row;
  Causal causal = Causal::kBottomRight;  ///< the problem it runs on: the model's, or kNone if the
                                         ///< method is non-causal (nystrom)
  /// The window (keys) of the problem it runs on: the layer's, 0 when none or when it hides no
  /// key under `causal`.
  std::int64_t window = 0;
};
/// `window`: the layer's sliding window in keys (0 = none); `keys_per_row` then counts the keys
/// that the causal rule and the window leave each row.
Budget method_budget(const AttentionMethod& m, std::int64_t nq, std::int64_t nk, std::int64_t window = 0);

/// One row of predict.csv.
struct PredictRow {
  std::string method;  ///< canonical spec
  std::string param;   ///< Budget::param
  const char* metric = "";   ///< "rel_fro_P" or "mean_row_l1_P"
  const char* causal = "";   ///< the problem's causal rule
  double predicted = 0;  ///< the lower bound above
  double measured = 0;   ///< the method's error in `metric`
  double output_rel_fro = 0;  ///< ‖(P̂ − P)·V‖_F / ‖P·V‖_F (float64, from the same P̂)
  std::int64_t budget_excess = 0;  ///< kKeysPerRow: the largest nonzero count of a row of P̂ minus
                                   ///< its budget (≤ 0 when the method kept to its budget)
  std::int64_t window = 0;  ///< Budget::window: the window of the problem it ran on (0 = none)
  /// Empty when the method ran; else why it did not (its can_run's reason on the windowed
  /// problem), and predicted, measured and output_rel_fro are NaN.
  std::string skipped;
};

/// Predicted and measured error of each method in `specs` on one head: Q (Nq×d), K (Nk×d),
/// V (Nk×dv), `scale`; the model's causal rule is bottom-right, `window` its sliding window in
/// keys (0 = none). Each method runs on float32 copies of Q and K (exact when they came from
/// float32 data, as a capture does). A method that cannot run the windowed problem gives a row
/// with `skipped` set. Throws numattn::Error for a spec without a budget (method_budget), a
/// negative window, or a method that cannot run the head without a window.
std::vector<PredictRow> predict_head(const Matrix& q, const Matrix& k, const Matrix& v, double scale,
                                     const std::vector<std::string>& specs, const ExecContext& ctx,
                                     std::int64_t window = 0);

/// The default method list of `numattn analyze --predict`.
std::vector<std::string> default_predict_specs();

}  // namespace numattn::analysis
