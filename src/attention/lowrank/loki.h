#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `lowrank.loki(rank_frac=0.25, topk_frac=0.25)`: Loki (Singhania, Singh, He, Feizi, Bhatele,
/// NeurIPS 2024). Keys live near a low-dimensional subspace, so scores in
/// its first r principal coordinates rank keys well enough to *choose* them; the chosen keys
/// then get exact softmax attention with full-dimensional dot products.
///
/// Per (batch, kv head): P_r = the r = ceil(rank_frac·Dk) leading eigenvectors of the keys'
/// second-moment matrix Σⱼ kⱼᵀkⱼ (uncentred: P_r then spans the best rank-r approximation of K,
/// which is what dot products with K see). Per query row i: approximate logits
/// s̃ᵢⱼ = scale·(qᵢP_r)·(kⱼP_r) + maskᵢⱼ over the keys it sees; T_i = the
/// ceil(topk_frac·|visible keys|) largest (ties: lower index); output = exact softmax over T_i
/// with logits scale·qᵢ·kⱼ + maskᵢⱼ.
///
/// **Self-calibration.** Loki computes P offline from calibration text, per layer and head.
/// Here the basis comes from the problem's own keys (all finite keys of the kv head, including
/// those a causal row does not see yet): the same estimator on the data at hand. It only
/// steers which keys are chosen; the output of each row is still a softmax over keys it sees.
///
/// Supports both causal alignments, boolean and additive masks and sliding windows: selection
/// is among the keys each row sees. Error: the softmax mass of the keys left out (renormalised
/// away, a bias), plus keys ranked out by the r-dimensional scores. Limit case: topk_frac = 1 is
/// exact softmax attention for any rank_frac.
///
/// Cost. Loki's own saving is to compute exact logits only for the k = topk_frac·Nk chosen keys
/// (O(Nq·Nk·r + Nq·k·(Dk+Dv)), on GPUs with gather kernels). On a CPU, gathering k scattered
/// keys per query runs far below GEMM speed, so here each 64-row block computes the exact
/// logits of its whole key span by one sgemm and gives the unchosen keys weight 0 before the
/// P·V sgemm: the same result (the chosen keys' logits are the same float32 dot products),
/// O(Nq·Nk·(Dk + Dv + r)) time plus an O(Nq·Nk) selection (radix pass + nth_element per row).
/// It is therefore slower than `exact.flash` (about 10× at N = 4096, D = 64, 2 threads); it measures
/// Loki's accuracy, not its GPU speed-up. Memory: O(Nk·r) per kv head and O(64·Nk) per thread.
/// No LSE (the softmax over T_i is not the row's log-sum-exp).
class LokiAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn
