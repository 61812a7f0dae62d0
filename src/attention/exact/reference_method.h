#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `exact.reference`: the float64 oracle (reference.h) as a registered method; the output is
/// the float64 result rounded once to float32.
///
/// Cost: O(Nq·Nk·(Dk+Dv)) per head in double precision, O(Nk) extra memory per thread.
class ReferenceAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn
