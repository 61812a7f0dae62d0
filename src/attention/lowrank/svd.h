#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `lowrank.svd(rank)`: the best rank-r approximation of the softmax matrix, the oracle every
/// low-rank method is compared with (on Llama 3.2, A = exp(S) shows strong singular value decay
/// and Z⁻¹A weaker: Serret et al., "Attention Mechanisms Through the Lens of Numerical Methods",
/// arXiv 2604.01757, 2026).
///
/// Per (batch, query head): P = softmax(s·QKᵀ + mask) (Nq×Nk, rows stochastic, with the boolean
/// and additive masks of problem.h; rows that see no key are 0) is
/// materialised in float64, its truncated SVD P_r = U_r Σ_r V_rᵀ is taken (LAPACK dgesdd through
/// decomp/dense.h, thin factors), and out = U_r·(Σ_r·(V_rᵀ·V)) is rounded once to float32. By Eckart–Young P_r is the
/// best rank-r approximation of P in the spectral and Frobenius norms; the output error is
/// ‖(P − P_r)V‖ ≤ σ_{r+1}(P)·‖V‖₂ (it is not the best rank-r approximation of PV). Keys no query
/// sees and queries that see no key are dropped before the SVD, so non-finite values there are
/// never read. Limit case: rank ≥ min(Nq, Nk), where P_r = P (then computed as P·V without the
/// SVD, which returns P to float64 rounding anyway).
///
/// Causal rules and sliding windows: by the causal recursion (auto/causal.h; method.h,
/// `causal_recursion`), i.e. the rank-r oracle of each fully visible off-diagonal block, exact
/// diagonal blocks, normalisers from exact.flash. Not natively: the truncated SVD of the whole
/// causal P mixes the rows, so the rank-r row i would depend on later rows and their keys (a
/// future key changes an earlier output); the recursion's blocks see only keys every one of
/// their rows sees. A mask on a causal or windowed problem is refused (it would have to reach
/// the recursion's blocks).
///
/// Cost per head: O(Nq·Nk·(Dk + Dv) + Nq·Nk·min(Nq, Nk)) time (the SVD dominates), memory
/// O(Nq·Nk) doubles per thread for P and its factors. Refused (with the size) when Nq·Nk exceeds
/// 4096·4096 entries (128 MiB of P per head, about 9× that with the SVD's copy, factors and
/// workspace). Not a fast method: a measuring instrument.
class SvdAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// The largest Nq·Nk it accepts.
  static constexpr std::int64_t kMaxEntries = std::int64_t{4096} * 4096;
};

}  // namespace numattn
