/// @file bdv_attention.h
/// GQA attention whose value projection is the fused Basis Decomposition projection of the VO
/// pair (BD Attention; Zhao et al., "Basis Decomposition for Attention", model/bda_model.h):
/// V'_g = xn[S] + xn[S^c]·C_g per KV head g (transform/bd_projection.h), which the cache holds,
/// and W_o' in place of W_o, so that A·W_o'ᵀ equals the dense layer's output up to rounding.
/// The stacked matrix holds Wq|Wk only. Weights: (Hq+Hkv)·D·E + the projection's coefficients
/// ((E−D)·Hkv·D, plus D² per dense-fallback head) + E·Hq·D. The coefficients are float32, or
/// (LlamaLayer::v_bd_q) re-quantized to the source value tensor's type and multiplied by
/// quant_linear after the basis part is filled in (BdProjection::fill_basis). A decode step
/// (few tokens, float32 activations) runs both quantized products, Wq|Wk on xn and C_stackᵀ on
/// xn[S^c], in one fork of the team, each thread a share of the rows of both in proportion to
/// their bytes: as one stacked product, not two.
#pragma once

#include "numattn/model/blocks/gqa_attention.h"

namespace numattn {

class BdvAttention final : public GqaAttention {
 public:
  BdvAttention(const LlamaLayer& layer, const ModelHParams& hp, std::int64_t index);
  std::string kind() const override { return "bd-v"; }

 protected:
  std::int64_t in_rows() const override { return (Hq_ + Hkv_) * D_; }
  void project_rows(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1, float* rows,
                    std::int64_t ld) const override;
  std::int64_t extra_weights() const override;
  std::uint64_t extra_weight_bytes() const override;
};

}  // namespace numattn
