#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `exact.naive`: float32 attention with materialised scores, the textbook three steps
/// S = scale·Q·Kᵀ (BLAS), row softmax with max subtraction, O = P·V (BLAS).
///
/// Works on blocks of 256 query rows so that each thread holds a 256 × Nk score block.
/// Cost: O(Nq·Nk·(Dk+Dv)) time, O(threads · 256 · Nk) workspace. The float32 baseline that
/// `exact.flash` must match (its error is bounded by 2× this one's in tests). A row whose
/// visible logits are not all finite comes out NaN, for `run` to settle (problem.h).
class NaiveAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn
