#pragma once

#include <vector>

#include "attention/sparse/reformer.h"
#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.scatterbrain(features=256, buckets=0, rounds=1, chunk=64, seed=0)`: Scatterbrain (Chen,
/// Dao, Winsor, Song, Rudra, Ré, NeurIPS 2021): a low-rank plus sparse
/// estimate of the unnormalised attention matrix, Â = Q'K'ᵀ + S.
///
/// - Low rank: Performer's positive random features φ_+ (kernel.performer's construction: its
///   orthogonal directions with χ_d norms, `directions`, drawn per KV head), L_ij = φ(q_i)·φ(k_j)
///   with E L_ij = exp(s_ij), s_ij = scale·q_i·k_j (inputs scaled by √scale).
/// - Sparse: the LSH collision pairs P_i = ∪_r W_r(i) of sparse.reformer's windows (same
///   hashing, chunks and seed; reformer.h), where S_ij = exp(s_ij) − L_ij, so that Â_ij = exp(s_ij)
///   exactly on collision pairs and Â_ij = L_ij elsewhere (E Â = A: unbiased).
/// - Output: o_i = (φ(q_i)(Φ_Kᵀ V) + Σ_{j∈P_i} S_ij v_j) / (φ(q_i)(Φ_Kᵀ 1) + Σ_{j∈P_i} S_ij), with a
///   key seen in several rounds counted once (S_ij/N_ij per round, as Reformer's correction).
///
/// Numerically stable shifted form: the low-rank part is computed as Performer does, with query
/// features shifted by their row maximum a_i and key features by the head maximum b, i.e. in the
/// frame exp(a_i + b − log M); each sparse tile works in the frame c_i = max(a_i + b − log M,
/// max_j s_ij), where both exp(s_ij − c_i) and the low-rank term exp(a_i + b − log M − c_i)·L̃_ij are
/// ≤ 1; the pieces (numerator, denominator, frame) are combined relative to the largest frame. No
/// exponent overflows. The true denominator Σ_{j∈P_i} A_ij + Σ_{j∉P_i} L_ij is positive; if rounding
/// (cancellation when L ≫ A on P_i) makes the computed one ≤ 0, the row falls back to the sparse
/// part alone (softmax over P_i).
///
/// `features = 0`: no low-rank part (pure sparse: softmax over P_i, Reformer's estimate). When one
/// chunk holds every key (chunk ≥ Nk) every pair is a collision pair, the low-rank terms cancel
/// exactly and are skipped: exact attention whatever φ. Its kernel is non-causal (the paper's causal version,
/// prefix sums of φ(k)vᵀ and a causal mask in the sparse part, is not implemented); causal and sliding-window problems run by the causal recursion (AttentionMethod::causal_recursion, method.h).
/// No masks, no LSE output (log Σ_j Â_ij, the log of the estimated normaliser, could be
/// given as sparse.hyper does; not implemented).
///
/// Target: softmax. Refuses (Error) |scale|·max‖q‖·max‖k‖ > 1e6 when the low-rank part runs
/// (as kernel.performer). Cost per head O(N·M·(Dk+Dv) + rounds·N·2·chunk·(Dk+Dv+M)).
class ScatterbrainAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// The sparse support of query head (b, h): the rounds as forward plans them (for tests).
  std::vector<reformer::Round> plan(const AttentionProblem& p, index_t b, index_t h) const;
  /// The M × Dk directions ω (float64, before the √scale folding) of KV head hk (for tests; φ_+ of
  /// kernel.performer: PerformerAttention::features_f64 with the positive kernel).
  std::vector<double> directions(index_t d, index_t hk) const;
};

}  // namespace numattn
