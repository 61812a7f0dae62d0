/// @file factored_vo_attention.h
/// Collaborative VO heads run factored (Cordonnier, Loukas, Jaggi, "Multi-Head Attention:
/// Collaborate Instead of Concatenate", 2020; model/tensor_model.h, `vo-cp:...,exec=factored`):
/// one shared value projection U = V'·xn of rank R per token (what the value cache holds, one
/// R-wide row), head h's output (P_h·U) ⊙ μ_h, and x += O'·Σ_h (P_h·U) ⊙ μ_h. The stacked matrix
/// holds Wq|Wk|V' ([(Hq+Hkv)·D + R, E]); W_o is O' [E, R]. Weights (Hq+Hkv)·D·E + R·E + Hq·R +
/// E·R; cache Hkv·D + R floats per token.
#pragma once

#include "numattn/model/blocks/gqa_attention.h"

namespace numattn {

class FactoredVoAttention final : public GqaAttention {
 public:
  FactoredVoAttention(const LlamaLayer& layer, const ModelHParams& hp, std::int64_t index);
  std::string kind() const override { return "factored-vo"; }
  void capture(const ForwardStep& st, int layer, const float* xn, const float* scratch,
               const CaptureFn& fn) const override;

 protected:
  std::int64_t in_rows() const override { return (Hq_ + Hkv_) * D_ + rank_; }
  std::int64_t value_cache_width() const override { return rank_; }
  std::int64_t head_value_width() const override { return rank_; }
  std::int64_t wo_cols() const override { return rank_; }
  bool shared_values() const override { return true; }
  void output_rows(const ForwardStep& st, const float* att, std::int64_t t0, std::int64_t t1, float* x,
                   float* scratch) const override;
  std::int64_t extra_scratch() const override { return rank_; }
  std::int64_t extra_weights() const override { return Hq_ * rank_; }
  std::uint64_t extra_weight_bytes() const override { return 4 * static_cast<std::uint64_t>(Hq_ * rank_); }

 private:
  std::int64_t rank_;
};

}  // namespace numattn
