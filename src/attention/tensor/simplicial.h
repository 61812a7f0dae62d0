#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// `tensor.simplicial(w1, w2)`: 2-simplicial attention with sliding windows (Clift et al. 2019;
/// Roy et al. 2025), K' = K and V' = V (attention/simplicial.h has the
/// definition, the float64 oracle and the kernel, which also takes separate K', V').
///
/// Target: its own mechanism, `Target::simplicial(w1, w2)` (softmax over key pairs): run and
/// bench report `target_rel_fro_error` against it and `rel_fro_error` against softmax attention,
/// which it does not approximate. It computes its target exactly up to float32 rounding, so the
/// limit case is every parameter set and the budget is the exact float32 tolerance at the
/// target's logit magnitude. FLOP model: simplicial_flops (pairs, not query–key products).
/// Causal only (both alignments): its windows end at the diagonal, so without a causal rule it
/// would ignore keys the problem declares visible; refused with a reason. GQA, sliding window,
/// LSE; no masks.
class SimplicialAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  Target target() const override;
  double flops(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn
