/// @file mla_attention.h
/// Multi-head latent attention (DeepSeek-AI, "DeepSeek-V2", 2024, §2.1) as a block: the MLA
/// layer of model/mla_model.h (the formulas are in arch/mla_weights.h), naive or absorbed
/// (ForwardStep::mla_exec), then x += W_o·[o_0 | … | o_{Hq−1}]. Cache: one [c | k_rope] row of
/// r + d_rope elements per token (in LayerCache::k, or k16 for a half cache). Weights: the MLA
/// projections (MlaLayer::weights) + E·Hq·d_v. FLOPs per token (absorbed): 2·weights + 2·Hq·n_ctx·(2r + d_rope).
#pragma once

#include "numattn/model/blocks/block.h"

namespace numattn {

struct LlamaLayer;
struct ModelHParams;

class MlaAttention final : public AttentionBlock {
 public:
  MlaAttention(const LlamaLayer& layer, const ModelHParams& hp);
  std::string kind() const override { return "mla"; }
  std::int64_t weights() const override;
  std::uint64_t weight_bytes() const override;
  double flops_per_token(std::int64_t n_ctx) const override;
  CacheShape cache_shape() const override;
  /// float32, binary16 or bfloat16 latent rows (the absorbed execution reads halves in place).
  bool supports_cache(KvType) const override { return true; }
  std::int64_t scratch_per_token(const ForwardStep& st) const override;
  void project(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1, const LayerCache& cache,
               float* scratch, bool main) const override;
  void attend(const ForwardStep& st, const AttentionMethod& method, const LayerCache& cache,
              float* scratch) const override;
  void output(const ForwardStep& st, std::int64_t t0, std::int64_t t1, float* scratch, float* x,
              bool main) const override;

 private:
  /// Scratch: projections [N, mla_proj_width], query rows [N, qw], latent outputs [N, ow], head
  /// outputs [N, Hq·d_v], float32 cache rows [N, r + d_rope] (before a half cache rounds them).
  struct Layout {
    std::int64_t proj, q, lat, att, rows, qw, ow, total;
  };
  Layout layout(const ForwardStep& st) const;
  const LlamaLayer* L_;
  std::int64_t E_, Hq_;
};

}  // namespace numattn
