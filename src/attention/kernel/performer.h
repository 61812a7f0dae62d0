#pragma once

#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `kernel.performer(features=256, orthogonal=true, kernel=positive|trig|hyperbolic,
/// redraw=head|shared, causal_algo=block|prefix, seed=0)`: FAVOR+ (Choromanski et al., ICLR 2021).
///
/// Inputs are scaled x ← x·√scale (d^{-1/4} by default, so (√s q)·(√s k) is the softmax logit),
/// then, with M = `features` directions ω_m (orthogonal blocks with χ_d norms, decomp
/// random_features.h, or i.i.d. Gaussian):
/// - positive:   φ(x) = M^{-1/2} exp(ω_mᵀx − ‖x‖²/2), m ≤ M (E φ(q)·φ(k) = exp(q·k), all > 0);
/// - hyperbolic: φ(x) = (2M)^{-1/2} exp(±ω_mᵀx − ‖x‖²/2) (2M features, lower variance);
/// - trig:       φ(x) = M^{-1/2} exp(‖x‖²/2) [sin ω_mᵀx, cos ω_mᵀx] (2M signed features).
/// Output Y = D⁻¹ Φ_Q (Φ_Kᵀ V), D = diag(Φ_Q Φ_Kᵀ 1), by blocks/linear_attention.h.
///
/// Stabiliser: a query row is shifted by its own maximum of ω_mᵀx − ‖x‖²/2 (a per-row factor,
/// cancels in the row's normalisation), the keys of a head by one shift c (cancels), then
/// ε = 1e-6 is added to every feature; M^{-1/2} cancels and is not applied. The official code
/// takes c = the maximum over all keys and features, so that under a causal rule a later key
/// changes the features of every key and the outputs of earlier rows (a future token reaches the
/// past). Here c is that maximum over the keys every row that reads a key sees: all keys without a
/// causal rule (the official stabiliser), the first key of a square causal problem, the shared
/// prefix of a decode-like one (Nq < Nk, bottom-right). No row then depends on a key it does not
/// see. A row that sees a key whose exponent exceeds c by more than 60 is refused (Error: its
/// features would leave float32 sums). trig: the key weights exp(‖k‖²/2) are shifted the same way,
/// no ε, and a negative denominator estimate is clamped to 0 (that row comes out 0). The causal
/// form is FAVOR+'s prefix sums (or their block form), which read only the keys each row sees.
///
/// `redraw`: training redraws ω every few steps; one inference call has no steps, so the choice
/// left is how draws are shared: `head` draws ω independently per KV head (stream = kv head,
/// shared by the query heads of a GQA group, which share its key features), `shared` uses one draw
/// for every head. `seed` selects the draw; nothing depends on the thread count.
///
/// `features = 0` is the limit M → ∞: the estimator's expectation exp(q·k) evaluated exactly, i.e.
/// softmax attention by the exact flash kernel (quadratic; the conformance limit case).
///
/// Target: softmax. Causal: both alignments, by the block algorithm (default) or prefix sums.
/// Cost O(N·M·(Dk + Dv)) time, O(Nk·M) key features + O((N/b)·M·Dv) states.
/// Refuses (Error) a query row with |scale|·‖q‖·max‖k‖ > 1e6 over the keys it sees: the
/// estimator carries no information there and float32 projections lose the logits.
class PerformerAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  enum class Kernel { kPositive, kTrig, kHyperbolic };
  /// The M × d directions ω (float64, before the √scale folding) used for KV head `hk`.
  std::vector<double> directions(index_t d, index_t hk) const;
  /// φ(x) of one vector exactly as the formulas above, unshifted and in float64 (for tests):
  /// `x` is already scaled by √scale; writes feature_dim doubles.
  static void features_f64(Kernel kernel, const std::vector<double>& w, index_t m, const double* x, index_t d,
                           double* phi);
  Kernel kernel() const;
};

}  // namespace numattn
