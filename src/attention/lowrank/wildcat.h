#pragma once

#include <atomic>
#include <cstdint>

#include "numattn/attention/method.h"

namespace numattn {

/// `lowrank.wildcat(rank=64, tau=0, seed=0)`: WILDCAT (Schröder and Mackey, "WildCat:
/// Near-Linear Attention in Theory and Practice", arXiv 2602.10056, 2026).
/// Attention over a small *weighted coreset* of the keys.
///
/// Per (batch, kv head), with β = |scale| (the sign of the scale is carried by the queries):
/// 1. Coreset: S = the pivots of randomly pivoted Cholesky (decomp/rpcholesky.h) on
///    G = exp((β/τ²)·K·Kᵀ), up to `rank` of them. G is factored in the weighted form
///    G = D·G̃·D, G̃ᵢⱼ = exp(−(β/τ²)‖kᵢ − kⱼ‖²/2) (entries ≤ 1), Dᵢ = exp((β/τ²)‖kᵢ‖²/2), so that
///    nothing overflows: the pivots are drawn exactly as RPCholesky on G draws them.
/// 2. Nyström weights W = G_SS⁻¹·G_S: (r×Nk). With G ≈ F·Fᵀ from RPCholesky, G_{:,S} = F·F_Sᵀ
///    exactly, so W = F_S⁻ᵀ·Fᵀ: one triangular solve through the Cholesky factor (F_S, the
///    factor's rows at the pivots, is lower triangular), never an explicit inverse of the badly
///    conditioned exp(K_S·K_Sᵀ). Regularisation: RPCholesky stops when the residual trace
///    falls below 1e-12 of the initial one or a pivot's residual is rounding noise, which
///    bounds ‖F_S⁻¹‖. Computed as [W·V | W·1] = D_S⁻¹·F̃_S⁻ᵀ·F̃ᵀ·D·[V | 1] in float64 (D scaled
///    by exp(−max) and D_S⁻¹ folded into the query scores as a per-key bias).
/// 3. Per query: Ŷᵢ = Σ_s aᵢₛ(W·V)ₛ / Σ_s aᵢₛ(W·1)ₛ with aᵢₛ = exp(scale·qᵢ·kₛ − (β/τ²)‖kₛ‖²/2 − mᵢ),
///    mᵢ the row maximum (so nothing overflows): two sgemm per 64-row block.
///
/// τ (`tau`): scores are invariant under Q → τQ, K → K/τ, but the Nyström approximation is not;
/// larger τ makes G lower-rank and the query side exp(β·τ²‖q‖²) larger. The paper gives a closed
/// form that we could not verify, so it is not used; `tau = 0` (default) uses
/// τ² = 2·max‖k‖ / max‖q‖ over the kv head's keys and its group's queries. Without the factor 2
/// this is the radius balance (scaled queries and keys in balls of the same radius, the
/// bounded-input setting of the paper's bound); the factor 2 was the best of 1, 2, 4, 8, 16 on
/// Gaussian and spiky inputs (N = 1024, D = 64, logits ×1 and ×10), e.g. Gaussian ×1: rel
/// error 3.37 (factor 1) vs 0.77 (factor 2) at rank 64. An empirical default, not the paper's.
///
/// Denominators: W is signed, so W·1 can have entries ≤ 0 and a row's denominator Σ aᵢₛ(W·1)ₛ
/// can cancel. Rows whose denominator is below 1e-3·Σ|aᵢₛ(W·1)ₛ| (including ≤ 0) fall back to
/// exact softmax attention over all keys (O(Nk·(Dk+Dv)) each) and are counted in
/// `fallback_rows()`.
///
/// Its kernel is non-causal (the coreset summarises all keys for every query); causal and sliding-window problems run by the causal recursion (AttentionMethod::causal_recursion, method.h).
/// No masks. GQA: the
/// query heads of a group share the coreset. Limit case: rank ≥ Nk takes every key (S = [Nk],
/// W = I exactly) and is exact softmax attention. Cost per kv head O(Nk·r·(d + r) + Nk·r·Dv)
/// to compress (float64), O(Nq·r·(Dk+Dv)) per query head to apply; memory O(Nk·(r + d)).
/// Randomness: pivots keyed by (seed, batch·Hkv + kv head), never by thread.
class WildcatAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
  /// Rows that fell back to exact attention (cancelling denominators), summed over every
  /// `forward` of this object.
  std::int64_t fallback_rows() const { return fallback_rows_.load(); }

 private:
  mutable std::atomic<std::int64_t> fallback_rows_{0};
};

}  // namespace numattn
