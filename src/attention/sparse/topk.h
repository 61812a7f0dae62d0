#pragma once

#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.topk(k=64)`: exact top-k attention, the oracle of every method that keeps k keys per
/// query (Gupta, Dar, Goodman, Ciprut, Berant, Memory-efficient Transformers via Top-k
/// Attention, 2021; the "heavy hitters" of QKᵀ that sparse methods compute exactly).
///
/// Per query row i: logits s_ij = scale·q_i·k_j + mask_ij over the keys j the row sees (causal
/// rule, window, masks: only visible keys compete); T_i = the min(k, visible) largest (ties:
/// lower key index first); output = exact softmax over T_i, LSE = log Σ_{j∈T_i} exp(s_ij) (the
/// true LSE of what it outputs, below the row's full LSE). Target: softmax over all visible keys;
/// the dropped mass is renormalised away (a bias). Recall of each row's true top-k is 1 by
/// construction (up to float32 ties of the logits).
///
/// Algorithm: per (batch, query head, block of 64 rows) one sgemm computes the logits of the
/// block's whole visible key span; per row a partial selection (nth_element on a copy of the
/// visible logits) finds the k-th largest, the chosen keys are gathered in index order and
/// their softmax·V accumulated (O(k·Dv) per row). Cost per query head: O(Nq·Nk·Dk) for the
/// scores (half with causal) + O(Nq·Nk) selection + O(Nq·k·Dv): it is slower than exact.flash
/// (it is an oracle of accuracy, not a speed-up). Workspace O(threads·64·Nk) floats. Every
/// visible key's k row is read (a NaN there reaches the row); v rows only of chosen keys.
/// Decoding (Nq = 1 over a KV cache) works through the same path, with no fast path of its own
/// (`Capabilities::decode` false): every cached key is scored, about 2× exact.flash's decode time.
/// Limit case: k ≥ Nk is exact softmax attention.
class TopkAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// The keys row (b, h, i) attends to, in increasing order, as `forward` chooses them (float32
  /// logits, same tie rule): for tests.
  static std::vector<index_t> selected_keys(const AttentionProblem& p, index_t b, index_t h, index_t i,
                                            index_t k);
};

}  // namespace numattn
