/// @file gated_ffn.h
/// Gated feed-forward (Shazeer, "GLU Variants Improve Transformer", 2020):
/// x += W_down·(g(W_gate·xn) ⊙ W_up·xn), with W_gate|W_up stacked as one [2F, E] matrix (one
/// product). The gate g (arch/hparams.h FfnGate): SwiGLU's silu(a) = a·σ(a) (Llama,
/// simd::silu_mul) or GeGLU's tanh-form GELU (Gemma, simd::gelu_tanh_mul).
/// Weights 3·F·E; FLOPs per token 2·3·F·E + O(F); scratch 3F floats per token.
#pragma once

#include "numattn/arch/hparams.h"
#include "numattn/model/blocks/block.h"

namespace numattn {

struct LlamaLayer;

class GatedFfn final : public FfnBlock {
 public:
  /// The layer's w_gate_up / w_down (either storage), which must outlive the block.
  GatedFfn(const LlamaLayer& layer, std::int64_t E, std::int64_t F, FfnGate gate)
      : L_(&layer), E_(E), F_(F), gate_(gate) {}
  /// "swiglu" or "geglu".
  std::string kind() const override { return gate_ == FfnGate::kSilu ? "swiglu" : "geglu"; }
  std::int64_t weights() const override { return 3 * F_ * E_; }
  std::uint64_t weight_bytes() const override;
  std::int64_t scratch_per_token() const override { return 3 * F_; }
  void forward(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1, float* scratch, float* x,
               bool main) const override;

 private:
  const LlamaLayer* L_;
  std::int64_t E_, F_;
  FfnGate gate_;
};

}  // namespace numattn
