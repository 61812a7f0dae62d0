/// @file swiglu.h
/// SwiGLU feed-forward (Shazeer, "GLU Variants Improve Transformer", 2020), as Llama runs it:
/// x += W_down·(silu(W_gate·xn) ⊙ W_up·xn), with W_gate|W_up stacked as one [2F, E] matrix (one
/// product) and silu(g) = g·σ(g) by simd::silu_mul. GeGLU differs only in the gate's function.
/// Weights 3·F·E; FLOPs per token 2·3·F·E + 4F; scratch 3F floats per token.
#pragma once

#include "numattn/model/blocks/block.h"

namespace numattn {

struct LlamaLayer;

class SwigluFfn final : public FfnBlock {
 public:
  /// The layer's w_gate_up / w_down (either storage), which must outlive the block.
  SwigluFfn(const LlamaLayer& layer, std::int64_t E, std::int64_t F) : L_(&layer), E_(E), F_(F) {}
  std::string kind() const override { return "swiglu"; }
  std::int64_t weights() const override { return 3 * F_ * E_; }
  std::uint64_t weight_bytes() const override;
  std::int64_t scratch_per_token() const override { return 3 * F_; }
  void forward(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1, float* scratch, float* x,
               bool main) const override;

 private:
  const LlamaLayer* L_;
  std::int64_t E_, F_;
};

}  // namespace numattn
