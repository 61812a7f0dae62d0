/// @file reference.h
/// The float64 oracle: softmax attention (or any other target, target.h) computed row by row in
/// double precision.
///
/// Inputs are the float32 problem tensors, promoted exactly to double; logits, the running
/// maximum, the normaliser and the output accumulate in double. Per row it costs
/// O(Nk·(Dk+Dv)) time and O(Nk) memory, so a random sample of rows can be checked on problems
/// too large to materialise (`--check-rows`).
#pragma once

#include <vector>

#include "numattn/attention/problem.h"
#include "numattn/attention/target.h"
#include "numattn/core/exec.h"

namespace numattn {

/// Exact attention for one query row `(b, h, i)`: writes `Dv` doubles to `out_row` and returns
/// the natural-log LSE (`-inf` when no key is visible; then `out_row` is all zero).
///
/// Follows the edge semantics of problem.h: throws `NonFiniteInput` for a non-finite value the
/// row reads (its q row, the k and v rows of the keys it sees, in that order, keys in increasing
/// order) or a +inf additive mask entry. In float64 nothing overflows for finite float32 inputs.
/// `logit_magnitude` (optional) receives the row's L: the largest |scale|·Σ_d|q_d·k_d| + |mask|
/// over the keys whose weight is at least e^-104 of the largest (smaller weights are under
/// float32's smallest subnormal and carry nothing into a float32 result); 0 for an empty row.
/// It bounds the magnitude of every partial sum of a logit, so γ_D·L bounds a float32 logit's
/// rounding error even when terms cancel (|s| alone would not); with a mask of -1e9 for
/// "hidden" it stays the size of the logits that matter.
///
/// `target` (target.h) other than softmax: the row of that mechanism; the return value is then
/// the log of the row's denominator (−inf when it is ≤ 0). L is, for the Gaussian kernel, the
/// same bound on its exponent s·(q·k − ‖k‖²/2) (+ s‖q‖²/2 unnormalised); for polynomial and
/// feature-map targets the relative condition of the weights: Σ_f|terms| (times p for
/// (s·q·k)^p, over |s·q·k|) at its largest, over the largest |weight|. A weight that overflows
/// float64 (a polynomial of huge inputs) raises `Error`.
double reference_row(const AttentionProblem& p, index_t b, index_t h, index_t i, double* out_row,
                     double* logit_magnitude = nullptr, const Target& target = Target::softmax());

/// One query row, identified by its indices.
struct RowIndex {
  index_t b, h, i;
};

/// Float64 results for a set of rows: `out` is `rows.size() × Dv`, `lse` has one per row.
struct ReferenceRows {
  std::vector<RowIndex> rows;
  std::vector<double> out;
  std::vector<double> lse;
  double logit_magnitude = 0;  ///< L: the largest over these rows (see reference_row)
};

/// Both throw what `reference_row` throws, for the first offending row in (b, h, i) order
/// (whatever the thread count).
/// All rows in (b, h, i) order: `out` is the dense `[B, Hq, Nq, Dv]` result.
ReferenceRows reference_all(const AttentionProblem& p, const ExecContext& ctx,
                            const Target& target = Target::softmax());
/// The given rows, in the order given (`rows` must be valid indices of `p`).
ReferenceRows reference_rows(const AttentionProblem& p, std::vector<RowIndex> rows,
                             const ExecContext& ctx, const Target& target = Target::softmax());
/// `count` distinct rows drawn with the seeded RNG (all rows when `count` ≥ their number).
ReferenceRows reference_sample(const AttentionProblem& p, index_t count, std::uint64_t seed,
                               const ExecContext& ctx, const Target& target = Target::softmax());

}  // namespace numattn
