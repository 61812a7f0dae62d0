#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `kernel.tensorsketch(degree=2, sketch=256, exact=false, seed=0)`: polynomial attention with
/// TensorSketch features (Pham and Pagh, KDD 2013; decomp/sketch.h).
///
/// Target: `Target::polynomial(p, 1)`, out_i = Σ_j (s·q_i·k_j)^p v_j / (1 + Σ_j (s·q_i·k_j)^p), with
/// q, k used as given times √scale (no LayerNorm). Features φ(x) = IFFT(Π_t FFT(C_t √s·x)), r =
/// `sketch` (decomp/sketch.h; FFTW3 real FFTs; independent CountSketches per KV head), an unbiased
/// estimate of (s·q·k)^p with Var ≤ (3^p − 1)‖x‖^{2p}‖y‖^{2p}/r.
///
/// Denominator policy: the features are signed, so the estimate of Σ_j (s·q·k)^p (≥ 0 for even p)
/// can come out negative; it is clamped at 0 before the "1 +" of the target is added, so the
/// denominator is ≥ 1 (scaled with the features, see below). degree ∈ {2, 4} (even: the target's
/// denominator must be positive).
/// Non-causal: Y = Φ_Q(Φ_Kᵀ[V | 1]); causal (both alignments): the block algorithm (b = 128).
/// `exact=true`: ⟨x^{⊗p}, y^{⊗p}⟩ = (x·y)^p evaluated as such (quadratic): the limit case.
/// Cost O(N·p·(Dk + r log r) + N·r·Dv); memory O(Nk·r + r·Dv) per head.
class TensorSketchAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  Target target() const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn
