#pragma once

#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `lowrank.linformer(k, projection, seed)`: Linformer's projection along the sequence, with
/// training-free random projections in place of the learned E, F (Wang et al. 2020). E is k×Nk
/// and multiplies K from the left.
///
///     K' = E·K (k×Dk),  V' = E·V (k×Dv),  Ŷ = softmax(s·Q K'ᵀ)·V'
///
/// E = F (the paper's key–value sharing: projected key t and projected value t are the same
/// mixture of tokens), one E per kv head, drawn from (seed, kv head) and shared across the batch
/// (as a learned per-head parameter would be):
/// - `gaussian`: E_tj ~ N(0, 1/k) (Johnson–Lindenstrauss, E[EᵀE] = I);
/// - `sparse`: a signed CountSketch, column j has one ±1 in row h(j) (h, sign from Philox keyed
///   by (seed, head, j)); E[EᵀE] = I, and E·K costs O(Nk·Dk) instead of O(k·Nk·Dk);
/// - `identity`: E = I, defined only for k ≥ Nk (the limit case, exact attention; k ≥ Nk rather
///   than k = Nk so that the blocks of the causal recursion, method.h, take it too); refused
///   otherwise.
///
/// What the error is (a finding, not a defect of the implementation): the JL property preserves
/// inner products of E-projected *columns*, but softmax(Q(EK)ᵀ)(EV) is not an unbiased or
/// consistent estimate of softmax(QKᵀ)V: each projected value is a signed sum of about Nk/k
/// values (norm ≈ sqrt(Nk/k)·‖v‖), and each projected key has logits sqrt(Nk/k) times larger
/// than the originals, so the output is a near-one-hot pick of one random signed mixture. On
/// Gaussian inputs the relative error is about sqrt(Nk/k)·(its row-averaging ratio) and grows
/// with Nk; on spiky inputs it is as bad. Linformer works only with trained E and F.
///
/// Its kernel is non-causal (the projection mixes future tokens into every projected key);
/// causal and sliding-window problems run by the causal recursion (AttentionMethod::causal_recursion, method.h). No masks.
/// Cost per kv head: O(k·Nk·(Dk + Dv)) to project (gaussian: plus k·Nk normal draws; sparse:
/// O(Nk·(Dk + Dv))), then O(Nq·k·(Dk + Dv)) per query head (exact.flash kernels over k keys).
/// Workspace O(B·Hkv·k·(Dk + Dv) + threads·k·512) floats.
class LinformerAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// E (k×Nk, row-major float32) of kv head `hk` as `forward` draws it (gaussian or sparse),
  /// for tests and analysis.
  std::vector<float> projection_matrix(index_t hk, index_t nk) const;
};

}  // namespace numattn
