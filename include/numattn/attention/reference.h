/// @file reference.h
/// The float64 oracle: softmax attention computed row by row in double precision.
///
/// Inputs are the float32 problem tensors, promoted exactly to double; logits, the running
/// maximum, the normaliser and the output accumulate in double. Per row it costs
/// O(Nk·(Dk+Dv)) time and O(Nk) memory, so a random sample of rows can be checked on problems
/// too large to materialise (`--check-rows`).
#pragma once

#include <vector>

#include "numattn/attention/problem.h"
#include "numattn/core/exec.h"

namespace numattn {

/// Exact attention for one query row `(b, h, i)`: writes `Dv` doubles to `out_row` and returns
/// the natural-log LSE (`-inf` when no key is visible; then `out_row` is all zero).
double reference_row(const AttentionProblem& p, index_t b, index_t h, index_t i, double* out_row);

/// One query row, identified by its indices.
struct RowIndex {
  index_t b, h, i;
};

/// Float64 results for a set of rows: `out` is `rows.size() × Dv`, `lse` has one per row.
struct ReferenceRows {
  std::vector<RowIndex> rows;
  std::vector<double> out;
  std::vector<double> lse;
};

/// All rows in (b, h, i) order: `out` is the dense `[B, Hq, Nq, Dv]` result.
ReferenceRows reference_all(const AttentionProblem& p, const ExecContext& ctx);
/// `count` distinct rows drawn with the seeded RNG (all rows when `count` ≥ their number).
ReferenceRows reference_sample(const AttentionProblem& p, index_t count, std::uint64_t seed,
                               const ExecContext& ctx);

}  // namespace numattn
