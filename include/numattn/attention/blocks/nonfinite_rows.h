/// @file nonfinite_rows.h
/// Non-finite inputs for methods that mix rows (attention-specific building block).
///
/// The edge semantics of problem.h ask that a NaN or ±inf a query reads reach that query's output
/// row, and that `AttentionMethod::run` then name the input (`NonFiniteInput`, found by tracing
/// the first non-finite output row in (b, h, i) order). Exact kernels get this for free. Methods
/// that mix rows (segment means and sampled landmarks of Q, projections along the sequence, an
/// SVD of the whole score matrix) would spread one bad q row to every row of the head, including
/// rows before it that never read it, which `run` would then report as a bug in the method.
///
/// `mark_rows_reading_nonfinite` is the guard such methods call first: one vectorised pass over
/// q, k, v (O((Nq·Dk + Nk·(Dk+Dv))·B·H), negligible next to any method) and, only when something
/// is not finite, the rows that read it (visibility as in problem.h: causal rule, window, masks;
/// +inf additive entries count as a non-finite input of the row). It writes NaN to exactly those
/// output rows and 0 to every other row, and returns true: the caller then skips its computation,
/// and `run` raises `NonFiniteInput` for the first of them.
#pragma once

#include "numattn/attention/problem.h"
#include "numattn/core/exec.h"

namespace numattn::blocks {

/// True when some query row of `p` reads a non-finite value (then the output is written as
/// described above); false otherwise, and nothing is written: non-finite values in keys no query
/// sees are then the caller's to skip (unused KV-cache slots may hold anything).
bool mark_rows_reading_nonfinite(const AttentionProblem& p, const ExecContext& ctx);

}  // namespace numattn::blocks
