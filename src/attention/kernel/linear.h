#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `kernel.linear(feature=elu1|relu)`: linear attention with a fixed feature map (Katharopoulos et
/// al., ICML 2020), the feature-map form: out_i = Σ_j (φ(q_i)·φ(k_j)) v_j / Σ_j φ(q_i)·φ(k_j)
/// with φ(x) = elu(√s·x) + 1 (> 0) or relu(√s·x) (≥ 0; a row whose weights all vanish comes out 0),
/// applied to x·√scale like every kernel method here (so `--scale` acts on it).
///
/// Target: that feature map (`Target::feature`): the method *replaces* softmax, and its float32
/// result equals the target up to float32 rounding (the limit case is every parameter set).
/// Causal: both alignments, block algorithm (blocks/linear_attention.h). Cost O(N·Dk·Dv).
/// Refuses (Error) inputs whose weighted sums could leave float32.
class LinearKernelAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  Target target() const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn
