// Where attention results meet the edges of problem.h: non-finite inputs and float32 overflow
// (private header; docs/numerics.md, "Non-finite inputs and overflow").
#pragma once

#include "numattn/attention/method.h"

namespace numattn::detail {

/// Called by `AttentionMethod::run` after `forward`: the one check every method goes through.
///
/// Kernels do not look for bad inputs (a pass over K and V would cost as much as a decode
/// step); they only let NaN and ±inf propagate into the rows they touch, and make a row NaN
/// when they drop an infinite logit. This scans the output (and LSE) rows, O(Nq·Dv) per head,
/// and settles each non-finite one in float64, in (b, h, i) order:
/// - a refused input the row reads: `NonFiniteInput` (from `reference_row`);
/// - an LSE beyond the float32 range, requested: `Error` with the row and value;
/// - finite inputs whose float32 evaluation can leave the float32 range (bounds below): exact
///   methods get the row computed in float64 and rounded once; others an `Error` with the bounds;
/// - finite inputs within those bounds: `Error` reporting a bug in the method.
void settle_nonfinite_rows(const AttentionMethod& m, const AttentionProblem& p, const ExecContext& ctx);

}  // namespace numattn::detail
