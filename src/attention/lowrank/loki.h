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
/// key), else L = F rounded down to a multiple of 128 (to a power of two when F < 128), F the
/// smallest frontier (key_range end) of its rows. So a key beyond a row's frontier never shapes
/// its basis, its choice or its output (a causal row's output depends only on the keys it sees,
/// in both alignments), while its basis covers all but fewer than 128 of the keys it sees: the
/// recent keys matter (coarser steps measured worse, and a basis of every key, future ones
/// included, worse than steps of 128). About Nk/128 + 7 bases per kv head; their Gram matrices
/// are running sums. The
/// basis only steers which keys are chosen; the output of each row is still a softmax over keys
/// it sees.
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
/// O(Nk·Dk² + Σ_bases E·Dk·r) per kv head for the bases (running Gram sums; each basis projects
/// the E keys its blocks see: about Nk²/256 keys causal, one Dk-long dot product per key and
/// reduced coordinate); `flops` counts the scores, the exact part and the bases. Memory:
/// O(Σ_bases E·r) per kv head (about Nk²/256·r floats causal: 17 MB per kv head at Nk = 8192,
/// r = 16) and O(32·Nk) per thread and query head of a group. No LSE (the softmax
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
