#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `kernel.polysketch(degree=4, sketch=32, grain=256, exact=false, seed=0)`: PolySketchFormer
/// (Kacham, Mirrokni, Zhong, ICML 2024; sketches in decomp/sketch.h, causal blocks in
/// blocks/linear_attention.h).
///
/// Target: polynomial attention `Target::polynomial(p, 1)`: out_i = Σ_j (s·q_i·k_j)^p v_j /
/// (1 + Σ_j (s·q_i·k_j)^p). There is no LayerNorm inside the op (the paper applies one to q and
/// k in the model): q and k are used as given, times √scale, so (√s q)·(√s k) = s·q·k.
///
/// Features: ψ = φ_{p/2}(√s·x) by recursive degree-2 Gaussian sketches of size r = `sketch`
/// (decomp/sketch.h; φ₁(x) = x, φ_{2m} = GaussianSketch2(φ_m), fresh draws per level and per KV
/// head), then self-tensoring φ = ψ ⊗ ψ (r² features), so every weight (ψ(q)·ψ(k))² ≥ 0 and the
/// denominator is ≥ 1. Non-causal: Y = Φ_Q(Φ_Kᵀ[V | 1]); causal (both alignments): the block
/// lower-triangular algorithm with grain b = `grain` and the exact (ψ_Q ψ_Kᵀ)^{⊙2} inside each
/// block (blocks/linear_attention.h). degree ∈ {4, 8}.
///
/// `exact=true`: the exact tensor features, ⟨x^{⊗p}, y^{⊗p}⟩ = (x·y)^p, evaluated as such
/// (quadratic, blocks::exact_polynomial_attention; the d^p-dimensional features are never
/// formed): equals the target up to float32 rounding (the limit case).
/// Cost O(N·(Dk·r + r²·Dv) + N·b·(r + Dv)); memory O(Nk·r + r²·Dv) per head.
class PolySketchAttention final : public AttentionMethod {
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
