#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `exact.flash`: tiled online-softmax attention in float32 (FlashAttention's forward pass).
///
/// For each block of query rows, key/value tiles stream through cache; a running maximum m,
/// normaliser l and unnormalised accumulator are rescaled by exp(m_old − m_new) as each tile
/// arrives, so no Nq × Nk buffer ever exists. Tiles that the causal rule or window hide
/// entirely are skipped; only boundary tiles are masked element by element. For decoding
/// (few query blocks, long KV) the key range is split across threads and the partial
/// (m, l, acc) merge exactly through log-sum-exp.
///
/// Cost: O(Nq·Nk·(Dk+Dv)) time (about half for causal), O(threads·(Bq·(Dk+Dv) + Bk·(Dk+Dv)))
/// workspace. Error: within a small constant of `exact.naive` (docs/numerics.md).
/// Dao et al., FlashAttention, NeurIPS 2022; Milakov & Gimelshein, Online normalizer
/// calculation for softmax, 2018.
class FlashAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn
