#pragma once

#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `lowrank.loki(rank_frac=0.25, topk_frac=0.25)`: Loki (Singhania, Singh, He, Feizi, Bhatele,
/// NeurIPS 2024). Keys live near a low-dimensional subspace, so scores in
/// its first r principal coordinates rank keys well enough to *choose* them; the chosen keys
/// then get exact softmax attention with full-dimensional dot products.
///
/// Per (batch, kv head) and calibration length L: P_r = the r = ceil(rank_frac·Dk) leading
/// eigenvectors of the second-moment matrix Σ_{j<L} kⱼᵀkⱼ of the keys [0, L) (uncentred: P_r then
/// spans the best rank-r approximation of those keys, which is what dot products with K see).
/// Per query row i: approximate logits s̃ᵢⱼ = scale·(qᵢP_r)·(kⱼP_r) + maskᵢⱼ over the keys it
/// sees; T_i = the ceil(topk_frac·|visible keys|) largest (ties: lower index); output = exact
/// softmax over T_i with logits scale·qᵢ·kⱼ + maskᵢⱼ.
///
/// **Calibration.** Loki computes P offline from calibration text, per layer and head. Here the
/// basis comes from the problem's own keys, but only from keys each row has seen: a block of 32
/// query rows uses L = Nk when all its rows see the last key (non-causal, no right window: every
/// key), else L = the largest power of two ≤ F, F the smallest frontier (key_range end) of its
/// rows. So a key beyond a row's frontier never shapes its basis, its choice or its output
/// (a causal row's output depends only on the keys it sees, in both alignments); calibration
/// grows with the prefix (the first rows use few keys, rows past position 2^t use at least 2^t),
/// about log2(Nk) bases per kv head. The basis only steers which keys are chosen; the output of
/// each row is still a softmax over keys it sees.
///
/// Supports both causal alignments, boolean and additive masks and sliding windows: selection
/// is among the keys each row sees. Error: the softmax mass of the keys left out (renormalised
/// away, a bias), plus keys ranked out by the r-dimensional scores. Limit case: topk_frac = 1 is
/// exact softmax attention for any rank_frac.
///
/// Algorithm: Loki's gather form. Per task (batch, kv head, 32 query rows, the group's query
/// heads together): the rows' approximate scores over the block's key span by a packed-panel
/// kernel (blocks::panel_scores over K·P_r packed once per kv head: r-long dot products); per row
/// an exact selection (blocks::select_top: a sample brackets the k-th largest, vector counting
/// passes narrow the bracket, nth_element runs on the band left; the keys of a stable sort) picks
/// T_i; then blocks::attend_chosen gathers the chosen keys' k and v rows chunk by chunk of keys,
/// so that the rows sharing keys read them from L1, for full-dimensional logits and the
/// softmax-weighted sum of values. Cost per query head: O(Nq·Nk·r) approximate scores + O(Nq·Nk)
/// selection + O(Nq·k·(Dk+Dv)) exact part (half of the first two with causal), plus
/// O(Nk·Dk·(Dk + r)) per kv head for the bases (Σ L ≤ 2·Nk Gram rows, about 4·Nk projected
/// keys); `flops` counts the scores, the exact part and the bases. Memory: O(Nk·r) per kv head
/// (about 4·Nk·r causal) and O(32·Nk) per thread and query head of a group. No LSE (the softmax
/// over T_i is not the row's log-sum-exp).
class LokiAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  double flops(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// T_i of row (b, h, i) as `forward` chooses it (increasing): for tests.
  std::vector<index_t> chosen_keys(const AttentionProblem& p, index_t b, index_t h, index_t i) const;
};

}  // namespace numattn
