#pragma once

#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.window(left=256, right=256, sinks=4)`: sliding-window attention with attention sinks
/// (Longformer's local band, Beltagy et al. 2020; StreamingLLM's sinks, Xiao et al., ICLR 2024).
///
/// Query row i attends, by exact softmax, to the keys j of its band about the diagonal
/// d = i + off (off = Nk − Nq for bottom-right causal alignment, else 0, as in problem.h):
///     d − left ≤ j ≤ d + right,
/// plus the `sinks` first keys j < sinks wherever they lie; both only among the keys the
/// problem itself lets row i see (its causal rule, its own window and masks intersect). The
/// target is softmax over ALL visible keys: the keys outside band ∪ sinks are dropped and the
/// kept weights renormalised (a bias of the dropped softmax mass). Under a causal rule `right`
/// changes nothing; for non-causal use the default band is symmetric.
///
/// Algorithm: the band is `exact.flash` on the problem with its window narrowed to
/// (min(left, window_left), min(right, window_right)), which touches only tiles inside the
/// band; the sink keys outside the band (at most `sinks` per row, none for rows whose band
/// already starts at key 0) are a second exact pass, merged with the band's result through
/// log-sum-exp (disjoint key sets, so the merge is exact). The LSE output is the true LSE of
/// the keys the row attends to (band ∪ sinks).
///
/// Shapes as problem.h (GQA, batched heads, any strides). Cost per query head:
/// O(Nq·(left + right + 1 + sinks)·(Dk + Dv)) (causal: O(Nq·(left + 1 + sinks)·(Dk + Dv))) plus
/// the band's tile rounding (≤ 64 rows of slack per block); workspace: flash's plus Nq floats
/// per head for the band's LSE when sinks are used. A decode step (Nq = 1 over a KV cache of Nk)
/// reads only the sinks and the last `left + 1` keys: keys outside band ∪ sinks are never read,
/// so (unlike the exact methods) a NaN there does not reach the output.
/// Limit case: left, right ≥ Nq + Nk is exact softmax attention.
class WindowAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
  /// Keys whose K/V rows forward reads for row i: band ∪ sinks among the visible keys.
  index_t keys_read(const AttentionProblem& p, index_t i) const;

  /// The keys row i attends to, in increasing order (for tests and the float64 transcription):
  /// band ∪ sinks among the keys `p` lets row i see by causal rule, window and boolean mask
  /// (additive −inf entries are left to the logits).
  static std::vector<index_t> attended_keys(const AttentionProblem& p, index_t i, index_t left,
                                            index_t right, index_t sinks);
  /// The same for row i of batch b and query head h (a mask that varies over them).
  static std::vector<index_t> attended_keys(const AttentionProblem& p, index_t b, index_t h, index_t i,
                                            index_t left, index_t right, index_t sinks);
};

}  // namespace numattn
