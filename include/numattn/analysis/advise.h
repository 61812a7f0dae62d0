/// @file advise.h
/// Which approximate method to use on this input: measured, not guessed.
///
/// `advise` runs exact.flash (the baseline) and every registered approximate method over a
/// small grid of its main parameter on the caller's problem, estimates each output's error from
/// one shared sample of rows computed exactly (estimate.h: the same rows and the same float64
/// reference for every candidate), times each (median of `reps` runs after a warm-up, in the
/// same process and on the same problem as the baseline), and picks the fastest candidate whose
/// upper bound `est_rel_error_hi` is at most `tol` and that is faster than the baseline. None may
/// qualify: then there is no choice (exact.flash stays the answer).
///
/// Grid: a method's defaults and the values of its accuracy contract's convergence parameter
/// (accuracy.h, `convergence.values(p)`), at most `max_per_method` of them.
/// Exact in disguise: a candidate that computes exact softmax attention on this problem is not
/// an approximation, and is reported with kind "exact" and never chosen. It is recognised before
/// running (its parameters reach the contract's `limit_case(p)`: e.g. a window of at least
/// Nq + Nk, top-k with k ≥ Nk), or after (its estimated error is within the float32 tolerance of
/// exact methods, `exact_f32_tolerance(L).rel_fro_error`, e.g. a window covering every key a
/// causal row sees). Methods of a target other than softmax are measured against softmax too.
///
/// Cost: one reference sample (m rows), then per candidate (1 + reps) runs; a candidate whose
/// warm-up run is over `slow_factor` times the baseline's median is timed by that run alone (it
/// cannot be chosen). `p.out` (and `p.lse`) are overwritten by the runs: the last run's output.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "numattn/analysis/estimate.h"
#include "numattn/attention/method.h"

namespace numattn {

struct AdviseOptions {
  double tol = 1e-2;                 ///< the error target: est_rel_error_hi ≤ tol
  index_t est_rows = 32;             ///< rows of the shared estimate sample
  double level = 0.95;               ///< confidence level of the bound
  std::uint64_t seed = 0;            ///< seed of the row design
  int reps = 3;                      ///< timed runs per candidate (median)
  double slow_factor = 4;            ///< see above
  /// A grid point whose warm-up is over this many times the baseline's median skips the rest of
  /// its method's grid (a method that slow at one budget is not a candidate at the others).
  double skip_factor = 20;
  std::size_t max_per_method = 5;    ///< grid points per method (defaults included)
  /// Method names to consider; empty = every registered method that is not exact, not dist.*
  /// and not auto.*.
  std::vector<std::string> methods;
};

struct AdviseCandidate {
  std::string spec;
  std::string kind;    ///< "baseline" (exact.flash) | "approximate" | "exact" (exact in disguise)
  std::string status;  ///< "ok" | "ok: timed once (slower than exact)" | "skipped: ..." | "failed: ..."
  double seconds;            ///< median time (NaN when not run)
  double speedup_vs_exact;   ///< baseline seconds / seconds
  ErrorEstimate estimate;    ///< rel_error NaN when not run
  bool meets = false;        ///< approximate, ran, est_rel_error_hi ≤ tol and faster than exact
};

struct Advice {
  double tol = 0;
  AdviseCandidate baseline;
  std::vector<AdviseCandidate> candidates;  ///< sorted: meeting first, then by time
  int choice = -1;                          ///< index into candidates, -1 = none
  const AdviseCandidate* chosen() const { return choice < 0 ? nullptr : &candidates[static_cast<std::size_t>(choice)]; }
};

/// Every spec `advise(p, opt)` tries besides exact.flash, in its order: the grids of the methods
/// `opt.methods` names (every registered approximate method by default). Throws `Error` for a
/// name not registered.
std::vector<std::string> advise_candidates(const AttentionProblem& p, const AdviseOptions& opt);

/// The specs advise tries for `info` on `p` (defaults first, deduplicated canonical specs).
std::vector<std::string> advise_grid(const MethodInfo& info, const AttentionProblem& p, std::size_t max_count);

/// Whether `m` at its parameters reaches its contract's limit case on `p` (exact softmax there),
/// with the reason ("" when not).
std::string exact_in_disguise(const AttentionMethod& m, const AttentionProblem& p);

/// Progress: (candidates done, total, the spec running now).
using AdviseProgress = std::function<void(std::size_t, std::size_t, const std::string&)>;

/// Runs the selection on `p` (see above). Throws what exact.flash throws on `p` (a non-finite
/// input), `Error` for tol < 0 or no runnable baseline; a candidate that throws is a failed row.
Advice advise(const AttentionProblem& p, const AdviseOptions& opt, const ExecContext& ctx,
              const AdviseProgress& progress = {});

}  // namespace numattn
