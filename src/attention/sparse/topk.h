#pragma once

#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.topk(k=64, select=exact, block=64, local=64, samples=4)`: top-k attention (Gupta, Dar,
/// Goodman, Ciprut, Berant, Memory-efficient Transformers via Top-k Attention, 2021).
///
/// **select=exact** (default): the oracle of every method that keeps k keys per query. Per query
/// row i: logits s_ij = scale·q_i·k_j + mask_ij over the keys j the row sees (causal rule, window,
/// masks: only visible keys compete); T_i = the min(k, visible) largest (ties: lower key index
/// first); output = exact softmax over T_i, LSE = log Σ_{j∈T_i} exp(s_ij) (the true LSE of what it
/// outputs, below the row's full LSE). Target: softmax over all visible keys; the dropped mass is
/// renormalised away (a bias). Recall of each row's true top-k is 1 by construction (up to
/// float32 ties of the logits). Algorithm: per (batch, query head, block of 64 rows) one sgemm
/// computes the logits of the block's whole visible key span; per row blocks::select_top finds
/// the k largest (the keys of a stable sort, in a few vector passes), and their softmax·V is
/// gathered (O(k·Dv) per row). Cost per query head: O(Nq·Nk·Dk) for the scores (half with
/// causal) + O(Nq·Nk) selection + O(Nq·k·Dv): slower than exact.flash (an oracle of accuracy,
/// not a speed-up). Workspace O(threads·64·Nk) floats. Every visible key's k row is read (a NaN
/// there reaches the row); v rows only of chosen keys. Decoding (Nq = 1 over a KV cache) works
/// through the same path, with no fast path of its own (`Capabilities::decode` false).
///
/// **select=block**: one choice of keys per `block` query rows and GQA group, chosen cheaply: the
/// vertical-slash pattern of MInference (Jiang et al., MInference 1.0, NeurIPS 2024: heavy key
/// columns shared by the rows, plus the diagonal band), here estimated per block. For rows
/// [i0, i1) of kv head hk: [begin, end) = the union of the rows' key ranges, near = (the smallest
/// row end) − local, clamped to [begin, that end]; far keys [begin, near) are visible to every row
/// of a causal block. `samples` rows per query head of the group (evenly spread, rounded to the
/// nearest row) give their exact softmax over the far keys they see; summed, it estimates each
/// far key's attention mass a_j. The k far keys of largest a_j (ties: lower index; all of them
/// when there are at most k) and the near keys [near, end) are attended, with exact softmax, by
/// every row of the block that sees them; LSE of those keys. Without masks or windows (every row
/// sees [begin, its end), ends stepping by one or all equal) the block is one dense sub-problem,
/// [chosen far | near] gathered contiguous, causal bottom-right (or none), run by the exact.flash
/// kernel (blocks/dense_softmax.h); otherwise each row attends its visible share through
/// blocks::attend_chosen. The sampled rows' logits use the kv head's keys packed once in panels
/// (blocks::panel_scores). A row that sees a non-finite k or v row, or whose q row is not finite,
/// comes out NaN (run() settles it). Future keys reach neither the choice nor the output of a
/// causal row (far keys precede the block's first row). Cost per query head:
/// O((samples/block)·Nq·Nk·Dk) estimate + O(Nq·(k + local + block)·(Dk + Dv)) attention; per
/// kv head a packed copy of K. Limit case: k ≥ Nk (with mass = 0) is exact softmax attention.
/// Decoding gets no fast path (a one-row block samples itself).
///
/// **mass = ε > 0** (select=block; top-p, the budget rule of Twilight, Lin et al., Twilight:
/// Adaptive Attention Sparsity with Hierarchical Top-p Pruning, 2025): k becomes a cap. The sampled
/// rows' softmax runs over the keys [begin, shared) before the block's first row end (far keys and
/// the near keys every row sees: no row's choice reads its future), so that the sum of a_j over
/// dropped far keys, divided by the number m of sampled rows, estimates the attention mass the rows
/// lose. The far keys in decreasing a_j (ties: lower index), the fewest whose estimated loss is at
/// most ε, at most k, are kept: a block whose rows look at a few far keys keeps few, a diffuse one
/// up to k. The `flops` model counts k far keys (an upper bound). The estimate comes from the
/// sampled rows only and the keys are chosen by them, so the loss of the other rows is larger
/// than ε (docs/methods.md measures by how much).
class TopkAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  double flops(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// The keys row (b, h, i) attends to, in increasing order, as `forward` chooses them (float32
  /// logits, same tie rule): for tests.
  static std::vector<index_t> selected_keys(const AttentionProblem& p, index_t b, index_t h, index_t i,
                                            index_t k);
  /// select=block: the keys row (b, h, i) attends to as `forward` chooses them (the block's far
  /// keys it sees, increasing, then the near keys it sees, increasing): for tests.
  std::vector<index_t> block_keys_of_row(const AttentionProblem& p, index_t b, index_t h, index_t i) const;
};

}  // namespace numattn
