/// @file lse_merge.h
/// Log-sum-exp merge of partial softmax results.
///
/// A partial result over a key set S is the pair (o_S, l_S) with l_S = log Σ_{j∈S} exp(s_j) and
/// o_S = Σ_{j∈S} exp(s_j − l_S)·v_j: softmax attention restricted to S. For disjoint sets the
/// exact result over their union is
///
///     l = logsumexp_r l_r,    o = Σ_r exp(l_r − l)·o_r.
///
/// The same formula merges the rounds of a hashing method whose key sets overlap (Reformer
/// without the duplicate correction, SMYRF, HyperAttention's blocks and samples): each round is
/// then weighted by its softmax mass.
///
/// Edge semantics: an empty partial has l = −inf and contributes nothing (its `o` is never
/// read, so it may be garbage); if every partial is empty the merged row is zero with l = −inf.
/// A NaN in any l or in a contributing o reaches the result. Accumulation is in float64.
/// Cost: O(R·Dv) per row.
#pragma once

#include <cstdint>
#include <limits>

namespace numattn::blocks {

/// Merges `parts` partial rows: `outs[r]` points at Dv floats, `lses[r]` is its log-sum-exp.
/// Writes the merged row to `out` (which may alias `outs[0]`) and returns the merged lse.
double lse_merge(const float* const* outs, const double* lses, int parts, std::int64_t dv, float* out);

/// In-place two-way merge: (acc, acc_lse) ← merge((acc, acc_lse), (o, lse)). `acc_lse` = −inf
/// means "nothing yet": then `acc` need not be initialised.
void lse_merge_into(float* acc, double& acc_lse, const float* o, double lse, std::int64_t dv);

}  // namespace numattn::blocks
