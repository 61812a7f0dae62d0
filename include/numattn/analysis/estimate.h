/// @file estimate.h
/// A-posteriori error estimate of one attention run from a few rows computed exactly.
///
/// After a method wrote `p.out`, `estimate_error` draws `m` query rows with a seeded design,
/// computes them in float64 with the reference (reference.h), and estimates the run's
/// relative Frobenius error against softmax attention
///     ε = ‖Ô − O‖_F / ‖O‖_F = sqrt(Σ_r e_r / Σ_r n_r),   e_r = ‖ô_r − o_r‖², n_r = ‖o_r‖²,
/// (sums over all B·Hq·Nq rows) together with a one-sided upper confidence bound.
///
/// Design (stratified over heads and row positions). m = 0 asks for the automatic size
/// `auto_estimate_rows(p)` = max(32, ⌈√R⌉), R = B·Hq·Nq: on the model's attention the error is
/// concentrated (on SmolLM2's captured layers 1% of the rows carry 5–60% of it, one head up to
/// 77%), and a fixed 32 rows of 18432 miss those rows too often; √R rows keep the estimate's
/// cost a falling fraction 1/√R of exact attention's while the sample grows with the problem.
/// The B·Hq (batch, head) pairs are the strata. With m ≥ B·Hq every stratum gets ⌊m/(B·Hq)⌋ rows
/// and a seeded choice of strata one more; with m < B·Hq a seeded choice of m strata gets one row
/// each. A stratum that gets m_s rows splits its Nq rows into m_s contiguous segments; with
/// m_s ≥ 2 it also splits its first segment where the number of visible keys (causal rule and
/// window, `key_range`) reaches the next power of two, so under a causal rule rows that see 1, 2,
/// 4, … keys are separate segments (the error of a top-k, low-rank or clustering method depends
/// on the visible keys against its budget, and it concentrates in those early rows). It draws one
/// row uniformly from each segment: the design has m rows plus up to ⌈log2 Nk⌉ per stratum under
/// a causal rule (`ErrorEstimate::rows` counts them). Row r then stands for
/// w_r = |segment_r|·(B·Hq / number of sampled strata) rows: the inverse of its inclusion
/// probability, so Σ w_r e_r and Σ w_r n_r are unbiased (Horvitz–Thompson) for Σ e and Σ n.
///
/// Statistic. The point estimate is the ratio estimator R̂ = Σ w_r e_r / Σ w_r n_r of the
/// squared error ε² (the nmse), reported as ε̂ = sqrt(R̂). Both totals are estimated: per draw,
/// A_r = m·w_r·e_r and B_r = m·w_r·n_r are the with-replacement (Hansen–Hurwitz) estimates of Σe
/// and Σn, whose sample variances and covariance s_AA, s_BB, s_AB give v_XY = (1 − m/R)·s_XY/m
/// (this ignores the gain of the stratification and so errs on the large side; (1 − m/R) is the
/// finite-population correction). On the model's attention both the row errors and the row
/// norms are heavy-tailed (on SmolLM2 layer 3, 1% of the rows carry 23% of ‖O‖²): a sample that
/// holds one of the large-norm rows overstates the denominator for every method at once, which
/// the linearised variance of R̂ (Cochran 1977 §6.4, its first-order form) does not see. The
/// bound is therefore Fieller's upper confidence limit for a ratio (E. C. Fieller, Some problems
/// in interval estimation, JRSS B 1954): the R with Ê − R·N̂ ≥ −t·sqrt(v_AA − 2R·v_AB + R²·v_BB),
/// whose largest value is the larger root of
///     (N̂² − t²v_BB)·R² − 2(Ê·N̂ − t²v_AB)·R + (Ê² − t²v_AA) = 0,
/// with Student's t quantile at m − 1 degrees of freedom and the one-sided `level` (exact,
/// `student_t_quantile`); ε_hi = sqrt of that root. When the denominator is not significantly
/// positive at that level (N̂² ≤ t²v_BB) the bound is +inf. The statistic is validated against the
/// true error by scripts/validate_estimate.py (coverage and the factor-2 rate in
/// docs/numerics.md).
///
/// Edges. m ≥ R: every row is computed, ε̂ is the true error and ε_hi = ε̂. m = 1 (or one row
/// drawn): no variance estimate, ε_hi = +inf. Rows whose reference is zero (a fully masked row:
/// no visible key; V rows of zeros) add their error to the numerator and nothing to the
/// denominator, as `rel_fro_error` does; when Σ w n = 0, ε̂ = 0 if no sampled row has an error,
/// else +inf. A non-finite output row makes ε̂ and ε_hi NaN. What the sample does not see it
/// cannot bound: an error confined to a fraction f of the rows is missed with probability about
/// (1 − f)^m, and the bound then reads 0.
///
/// Cost: m reference rows, O(m·Nk·(Dk + Dv)) in float64, plus O(m) to draw them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "numattn/attention/problem.h"
#include "numattn/attention/reference.h"
#include "numattn/core/exec.h"

namespace numattn {

struct ErrorEstimateOptions {
  index_t rows = 0;         ///< m, the rows computed exactly (≥ 1; 0 = auto_estimate_rows)
  double level = 0.95;      ///< one-sided confidence level of the bound, in (0.5, 1)
  std::uint64_t seed = 0;   ///< seed of the row design
};

struct ErrorEstimate {
  double rel_error = 0;     ///< ε̂, the estimate of ‖Ô − O‖_F / ‖O‖_F (NaN: non-finite output)
  double rel_error_hi = 0;  ///< ε_hi, the upper confidence bound (+inf with one row)
  index_t rows = 0;         ///< rows computed exactly
  double level = 0.95;      ///< confidence level of `rel_error_hi`
  index_t zero_norm_rows = 0;  ///< sampled rows whose reference output is zero
  double logit_magnitude = 0;  ///< L of the sampled rows (reference.h), for exact tolerances
};

/// A sampled row and the number of rows it stands for.
struct WeightedRow {
  RowIndex row;
  double weight;
};

/// max(32, ⌈√(B·Hq·Nq)⌉): the design's size when 0 rows are asked for.
index_t auto_estimate_rows(const AttentionProblem& p);

/// The stratified design above: min(m, B·Hq·Nq) distinct rows (m = 0: `auto_estimate_rows`),
/// plus the refinement of the first segments, in (b, h, i) order; depends only on the shape, the
/// causal rule, the window and `seed`.
std::vector<WeightedRow> stratified_rows(const AttentionProblem& p, index_t m, std::uint64_t seed);

/// The ratio estimate and its bound from per-row squared errors `e`, squared reference norms `n`
/// and weights `w` (equal lengths), for a population of `population` rows. Rows with a
/// non-finite `e` make both results NaN.
ErrorEstimate ratio_estimate(std::span<const double> e, std::span<const double> n,
                             std::span<const double> w, index_t population, double level);

/// The design's rows computed exactly: one sample serves every output of the same problem
/// (`advise` estimates all its candidates from one).
struct EstimateSample {
  std::vector<WeightedRow> design;
  ReferenceRows ref;  ///< float64 rows of `design`, in its order
};
EstimateSample draw_estimate_sample(const AttentionProblem& p, index_t rows, std::uint64_t seed,
                                    const ExecContext& ctx);
/// The estimate of `p.out`'s error from a sample of the same problem.
ErrorEstimate estimate_error(const AttentionProblem& p, const EstimateSample& s, double level);

/// Estimates the error of `p.out` (the method's output, already computed) against float64
/// softmax attention. Throws what `reference_row` throws (a non-finite input) and `Error` for
/// rows < 0 or a level outside (0.5, 1).
ErrorEstimate estimate_error(const AttentionProblem& p, const ErrorEstimateOptions& opt,
                             const ExecContext& ctx);

/// Quantile of Student's t distribution with `dof` ≥ 1 (integer) degrees of freedom at
/// probability `prob` in (0, 1): the exact CDF (Abramowitz & Stegun 26.7.3–4, finite series
/// for integer dof) inverted by bisection to 1e-12.
double student_t_quantile(double prob, index_t dof);

}  // namespace numattn
