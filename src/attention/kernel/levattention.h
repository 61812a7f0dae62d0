#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `kernel.levattention(keys=32, p=2)`: LevAttention (Kannan, Bhattacharyya, Kacham, Woodruff,
/// ICLR 2025). Every query attends, by exact softmax, only to a *universal
/// set* U of keys chosen from K alone: the `keys` keys of largest f-sensitivity, which for
/// f(x) = |x|^p with p = 2 are the leverage scores of K (decomp/leverage.h).
///
/// - Non-causal: ℓ = leverage scores of all Nk keys of the (batch, kv head) (thin QR + SVD,
///   rank tolerance), U = the `keys` largest (ties: lower index), then dense softmax attention
///   of every query of the GQA group over U.
/// - Causal (both alignments): query i sees the prefix of keys j < e_i. Each key gets its
///   *online* leverage score ℓⱼ^on = kⱼ(K_{≤j}ᵀK_{≤j} + λI)⁻¹kⱼᵀ, computed when it arrives
///   (λ = 1e-12·‖k_f‖² of the first nonzero key f, a rank guard), and U_i = the `keys` largest
///   online scores among the keys query i sees. Online scores of a key never depend on later
///   keys and λ depends on no key a row sees later (a row that does not see f sees only zero
///   keys, scored 0 whatever λ), so U_i and the row's output are a function of its visible
///   prefix alone: no later key, however large or non-finite, changes it; a sweep with a bounded heap
///   records when each key enters and leaves the top set, so the whole pass is
///   O(Nk·d² + Nk·log keys) per kv head, plus the attention.
///
/// Target: softmax. The paper's guarantee (|U| ≤ ψ/ε independent of N, every key of weight > ε
/// kept) holds for polynomial f; applying leverage-score selection to softmax attention is the
/// heuristic the paper evaluates on ViTs (top-32 keys), not a bound, so the error here is
/// measured, not promised by theory. Only p = 2 (leverage scores) is implemented; ℓp Lewis
/// weights for other p are not.
///
/// Cost per query head: O(Nk·d²) scores (per kv head) + O(Nq·keys·(Dk+Dv)) attention (two
/// sgemm per 64-row block); memory O(Nk·d) per kv head in flight, O(keys·(Dk+Dv)) gathered K/V.
/// Limit case: keys ≥ Nk gives exact softmax attention. No masks or windows (refused: a
/// universal set is a property of a key prefix, not of an arbitrary mask); no LSE.
class LevAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn
