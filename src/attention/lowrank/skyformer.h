#pragma once

#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `lowrank.skyformer(landmarks, gamma, pinv, iters, seed)`: Skyformer (Chen, Zeng, Ji, Yang,
/// NeurIPS 2021). It **replaces** softmax by the Gaussian kernel
/// κ(q, k) = exp(−s·‖q − k‖²/2) (s = the problem's scale; s = 1/sqrt(d) gives the paper's
/// exp(−‖q − k‖²/(2·sqrt(d)))), so its target is `Target::gaussian()`, and approximates the
/// kernel matrix A = κ(Q, K) by Nyström on the PSD matrix B = κ([Q;K], [Q;K]) (2N×2N), whose
/// off-diagonal block is A:
///
///     B̂ = B(:,S)·(B_SS + γI)⁺·B(S,:)   ⇒   Â = C_Q·(B_SS + γI)⁺·C_Kᵀ,  C_Q = κ(Q, X_S), C_K = κ(K, X_S)
///
/// Algorithm (official code): q, k scaled by sqrt(s) so that κ = exp(x·y − ‖x‖²/2 − ‖y‖²/2);
/// m landmark rows S sampled uniformly without replacement, half (⌊m/2⌋) from the Q rows and the
/// rest from the K rows (capped at Nq and Nk, the remainder taken from the other side), seeded by
/// (seed, batch, head); STAS = B_SS + γI; the symmetric diagonal rescaling D = diag(STAS·1)^(−1/2),
/// STAS ← D·STAS·D; its pseudo-inverse by `iters` Newton–Schulz steps in float32 (B3) or the
/// float64 symmetric eigendecomposition (`pinv=exact`, eigenvalues below 1e-6 of the largest
/// treated as zero); then C_Q·(D·STAS⁺·D)·(C_Kᵀ·V).
///
/// Normalisation (our choice, so that the output is comparable with softmax and with the
/// normalised Gaussian target): the official model drops Z⁻¹; we compute Â·[V | 1] and divide each
/// row by its last column, the estimate of Σ_j κ(q_i, k_j). Each row of C_Q is rescaled by its
/// largest entry first (the factor cancels in the ratio), so queries far from every landmark do
/// not underflow. The Nyström estimate is signed: a row whose estimated normaliser is not
/// positive (or whose ratio overflows) is set to 0; this is part of the measured error.
///
/// Limit case: landmarks ≥ Nq + Nk (every row of [Q;K]), γ = 0 and `pinv=exact`: then
/// B̂ = B·B⁺·B = B, so Â = A exactly, and the output is the normalised Gaussian attention, which
/// is computed directly (the Nyström product would lose, in floating point, what A carries in
/// factors below e^−745 for far-apart rows). Exact attention through the `exact.flash` kernels on
/// [q, 1]·[k, −‖k‖²/2] (the per-key bias form of the normalised Gaussian kernel).
///
/// Its kernel is non-causal (landmarks and C_Kᵀ·V mix all tokens); causal and sliding-window problems run by the causal recursion (AttentionMethod::causal_recursion, method.h)
/// on the Gaussian target. Refuses masks (not defined by the method), more than 256 landmarks with
/// the Newton–Schulz pseudo-inverse (its 8·iters·m³ flops; pinv=exact takes any m), scale ≤ 0 (no Gaussian
/// kernel), and inputs with s·max(‖q‖², ‖k‖²) > 1e6: the float32 kernel exponent
/// x·y − ‖x‖²/2 − ‖y‖²/2 carries a rounding error of about ε·s·(‖q‖² + ‖k‖²), which is then ≥ 0.1.
/// Cost per query head: O((Nq + Nk)·m·(Dk + Dv) + iters·m³); workspace O(threads·(1024·m + m²)).
class SkyformerAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Target target() const override { return Target::gaussian(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// The landmark rows of head (b, h) as `forward` samples them: indices into Q (first) and K.
  struct Landmarks {
    std::vector<index_t> q_rows, k_rows;
  };
  Landmarks landmarks(const AttentionProblem& p, index_t b, index_t h) const;

  /// Most landmarks the Newton–Schulz path accepts (pinv=exact has no limit).
  static constexpr index_t kMaxNsLandmarks = 256;
  /// Largest accepted s·max(‖q‖², ‖k‖²).
  static constexpr double kMaxScaledNorm2 = 1e6;
};

}  // namespace numattn
