#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `lowrank.nystrom(landmarks, pinv, iters)`: Nyströmformer (Xiong et al., AAAI 2021).
///
///     Ŷ = F1 · pinv(F2) · (F3 · V),  F1 = softmax(s·Q K̃ᵀ) (Nq×m),  F2 = softmax(s·Q̃ K̃ᵀ) (m×m),
///                                      F3 = softmax(s·Q̃ Kᵀ) (m×Nk)
///
/// Landmarks Q̃, K̃ are segment means: the rows are cut into m contiguous near-equal segments
/// (segment t = rows [⌊t·N/m⌋, ⌊(t+1)·N/m⌋), so N need not be divisible by m) and each is
/// averaged (in float64). Query landmarks: min(m, Nq); key landmarks: m. `pinv`: `newton_schulz`
/// (B3, decomp/pinv.h, `iters` steps in float32, as the official code) or `exact` (Moore–Penrose
/// pseudo-inverse by SVD in float64, singular values below 1e-6·σ_max dropped). The iteration's
/// few steps act as a regulariser; the exact inverse of an ill-conditioned F2 amplifies the
/// Nyström inconsistency (measured: 11 on Gaussian N = 130, 2.3e4 with logits ×100, against 0.55
/// and 1.8 with 6 steps), so `exact` is the unregularised reference, not a usable setting. The residual depthwise convolution of the official model is a
/// trained part of the architecture and is not included (training-free approximation).
///
/// Limit case: landmarks ≥ Nk. Then K̃ = K and F1 = P (the exact softmax matrix), and
/// pinv(F2)·F3 is the projection onto the row space of F3, which is the identity when F3 has
/// full column rank; like the official code (which special-cases m = N), we return F1·V = P·V,
/// computed exactly (exact.flash), without the projection.
///
/// Computation: F3·V and F1·(pinv(F2)·F3V) are dense softmax attentions of m landmark rows over Nk
/// keys and of Nq rows over m landmark keys, run by the `exact.flash` kernels
/// (blocks/dense_softmax.h, parallel over batch × heads × row blocks); F2 and its pseudo-inverse
/// (m×m) per head in parallel. Its kernel is non-causal (segment means mix future tokens);
/// causal and sliding-window problems run by the causal recursion (AttentionMethod::causal_recursion, method.h). No masks.
/// Cost per head: O((Nq + Nk)·m·(Dk + Dv) + m³·iters); workspace O(B·Hq·m·(Dk + Dv) + m²).
/// Error: Nyström-like, not a true Nyström method (softmax is not a PSD kernel): no a-priori
/// bound; measured budgets in describe().
class NystromAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn
