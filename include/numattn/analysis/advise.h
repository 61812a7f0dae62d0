/// @file advise.h
/// Which approximate method to use on this input: measured, not guessed.
///
/// `advise` runs exact.flash (the baseline) and the registered approximate methods on the caller's
/// problem, searching each method's budget parameter, estimates each output's error from one
/// shared sample of rows computed exactly (estimate.h: the same rows and the same float64
/// reference for every candidate), times each (median of `reps` runs after a warm-up, in the
/// same process and on the same problem as the baseline), and picks the fastest candidate whose
/// upper bound `est_rel_error_hi` is at most `tol` and that is faster than the baseline. None may
/// qualify: then there is no choice (exact.flash stays the answer).
///
/// Budget search. A method's budget parameter is its accuracy contract's convergence parameter
/// (accuracy.h: the parameter that buys accuracy, and which way: landmarks, k, keys, left,
/// topk_frac, clusters, ...); `budget_ladder` lays it out on `p` as powers of two (halvings of
/// a fraction), from the cheapest to just short of the limit case. The search runs the default,
/// then bisects the ladder for the cheapest value whose bound meets `tol` (the error falls along
/// the ladder and the cost grows): the default brackets the answer from above when it meets tol,
/// from below when not; a probe that misses tol and is already slower than exact.flash ends the
/// search (more budget costs more). At most `max_per_method` runs per method. Methods without a
/// convergence parameter, or whose target is not softmax (their budget converges to another
/// mechanism), are tried at their defaults only.
/// Exact in disguise: a candidate that computes exact softmax attention on this problem is not
/// an approximation, and is reported with kind "exact" and never chosen. It is recognised before
/// running (its parameters reach the contract's `limit_case(p)`: e.g. a window of at least
/// Nq + Nk, top-k with k ≥ Nk), or after (its estimated error is within the float32 tolerance of
/// exact methods, `exact_f32_tolerance(L).rel_fro_error`, e.g. a window covering every key a
/// causal row sees); for the search it meets the tolerance. Methods of a target other than
/// softmax are measured against softmax too.
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
  index_t est_rows = 0;              ///< rows of the shared estimate sample (0 = auto_estimate_rows)
  double level = 0.95;               ///< confidence level of the bound
  std::uint64_t seed = 0;            ///< seed of the row design
  int reps = 3;                      ///< timed runs per candidate (median)
  double slow_factor = 4;            ///< see above
  std::size_t max_per_method = 6;    ///< runs per method (the default and the search's probes)
  /// Method names to consider; empty = every registered method that is not exact, not dist.*,
  /// not auto.* and not lowrank.svd (the float64 low-rank oracle, O(N³) per head).
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

/// Every spec `advise(p, opt)` may try besides exact.flash: the grids of the methods `opt.methods`
/// names (every registered approximate method by default). Throws `Error` for a name not
/// registered.
std::vector<std::string> advise_candidates(const AttentionProblem& p, const AdviseOptions& opt);

/// The specs advise may try for `info` on `p`: the default, then `budget_ladder` (deduplicated
/// canonical specs).
std::vector<std::string> advise_grid(const MethodInfo& info, const AttentionProblem& p);

/// The budget ladder of `info` on `p` (see above), canonical specs from the cheapest (least
/// accurate) to the most accurate short of the limit case; empty without a budget parameter or
/// for a target other than softmax.
std::vector<std::string> budget_ladder(const MethodInfo& info, const AttentionProblem& p);

/// One probe of the budget search: whether the value ran, met the tolerance, and ran slower than
/// exact.flash.
struct BudgetProbe {
  bool ran = true;
  bool accurate = false;
  bool slower_than_exact = false;
};

/// The bisection of the budget search on a ladder of `n` values ordered by accuracy, the answer
/// (the cheapest accurate index) known to lie in [lo, hi] (hi = n: no accurate value known).
/// Calls `probe(i)` at most `max_probes` times; stops early when a probe fails to run, or misses
/// the tolerance while already slower than exact (a dearer value is slower still). Returns the
/// cheapest index known accurate (n: none). Assumes the error falls along the ladder.
std::size_t search_budget(std::size_t lo, std::size_t hi, std::size_t n, std::size_t max_probes,
                          const std::function<BudgetProbe(std::size_t)>& probe);

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
