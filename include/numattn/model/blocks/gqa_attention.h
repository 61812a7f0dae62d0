/// @file gqa_attention.h
/// Grouped-query attention with RoPE (Ainslie et al., "GQA", 2023; Su et al., "RoFormer", 2021),
/// as Llama and Gemma 3 run it, for the N new tokens of a call at positions p0..p0+N−1:
/// ```
///   Q,K,V = xn·Wqᵀ, xn·Wkᵀ, xn·Wvᵀ        Wq|Wk|Wv stacked as one [(Hq+2Hkv)·D, E] matrix
///   Q,K   = RMSNorm(Q_h) ⊙ q_norm, RMSNorm(K_h) ⊙ k_norm per head   (qk_norm models only)
///   Q,K   = RoPE(Q, K; positions)         θ_i = pos·base^(−2i/n_rot), i < n_rot/2
///   A     = attention(Q, K_cache ⊕ K, V_cache ⊕ V)   causal bottom-right, query head h reads
///                                                    KV head h / (Hq/Hkv); local layers: the
///                                                    last W keys only; scale attn_scale or 1/√D
///   x    += A·Woᵀ
/// ```
/// RoPE pairs (arch/hparams.h RopeLayout): adjacent (x[2i], x[2i+1]) for Llama GGUF files,
/// whose converter permutes HF's rotate-half q/k rows into that layout (llama.cpp's
/// LLAMA_ROPE_TYPE_NORM); halves (x[i], x[i + n_rot/2]) for Gemma (LLAMA_ROPE_TYPE_NEOX).
/// A local layer (ModelHParams::is_local) rotates with rope_base_local and hands the attention
/// method a problem with window_left = W − 1 (W = sliding_window): the model's own window, which
/// any method given to the layer sees (one without window support refuses the layer).
/// Cache: K and V rows [pos, Hkv, D], 2·Hkv·D elements per token, float32 or half precision
/// (KvCache's type: a token's K and V are rounded once, to nearest even, as they are appended;
/// the attention problem then reads the halves in place, problem.h HalfKv, and a method that
/// cannot read them runs on a float32 copy of the visible rows, widen_kv). Weights (Hq+2Hkv)·D·E + E·Hq·D.
/// FLOPs per token 2·weights + 2·Hq·min(n_ctx, W)·2D. Scratch per token: the Q|K|V row, the
/// attention output row (Hq·D) and, with a capture, the pre-RoPE Q|K copy (after the q/k norms).
///
/// Two further forms change only the value side and are blocks of their own built on this one:
/// BD-V (bdv_attention.h) and factored VO heads (factored_vo_attention.h).
#pragma once

#include "numattn/arch/hparams.h"
#include "numattn/model/blocks/block.h"

namespace numattn {

struct LlamaLayer;

class GqaAttention : public AttentionBlock {
 public:
  /// The layer's wqkv / wo (either storage) and norms, which must outlive the block; `index`
  /// is the layer's (whether it is local, its RoPE base).
  GqaAttention(const LlamaLayer& layer, const ModelHParams& hp, std::int64_t index);
  std::string kind() const override { return "gqa"; }
  std::int64_t window() const override { return window_; }
  std::int64_t weights() const override;
  std::uint64_t weight_bytes() const override;
  double flops_per_token(std::int64_t n_ctx) const override;
  CacheShape cache_shape() const override { return {Hkv_ * D_, value_cache_width()}; }
  bool supports_cache(KvType) const override { return true; }
  std::int64_t scratch_per_token(const ForwardStep& st) const override;
  void project(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1, const LayerCache& cache,
               float* scratch, bool main) const override;
  void attend(const ForwardStep& st, const AttentionMethod& method, const LayerCache& cache,
              float* scratch) const override;
  void output(const ForwardStep& st, std::int64_t t0, std::int64_t t1, float* scratch, float* x,
              bool main) const override;
  void capture(const ForwardStep& st, int layer, const float* xn, const float* scratch,
               const CaptureFn& fn) const override;

 protected:
  /// Rows of the stacked input matrix (the Q|K|V row width).
  virtual std::int64_t in_rows() const { return (Hq_ + 2 * Hkv_) * D_; }
  /// Floats per token of the value cache.
  virtual std::int64_t value_cache_width() const { return Hkv_ * D_; }
  /// Width of one head's value (and attention output) row.
  virtual std::int64_t head_value_width() const { return D_; }
  /// Columns of W_o (its input width): Hq·D.
  virtual std::int64_t wo_cols() const { return Hq_ * D_; }
  /// Whether every KV head reads the same value row (factored VO heads).
  virtual bool shared_values() const { return false; }
  /// The Q|K|V rows [t0, t1) (row stride `ld`) of xn: here the stacked product (BD-V adds its
  /// value projection).
  virtual void project_rows(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1, float* rows,
                            std::int64_t ld) const;
  /// x rows [t0, t1) += the output projection of the attention rows `att` (Hq·head_value_width()
  /// floats per token).
  virtual void output_rows(const ForwardStep& st, const float* att, std::int64_t t0, std::int64_t t1, float* x,
                           float* scratch) const;
  /// Floats per token of scratch beyond the base layout (factored VO: the mixed row).
  virtual std::int64_t extra_scratch() const { return 0; }
  /// Linear weights of the value side beyond the stacked matrix and W_o.
  virtual std::int64_t extra_weights() const { return 0; }
  virtual std::uint64_t extra_weight_bytes() const { return 0; }
  /// Scratch offsets (floats from the layer's scratch): rows [N, R], att [N, Hq·vw], pre-RoPE
  /// copies [N, (Hq+Hkv)·D] when capturing, then extra_scratch().
  std::int64_t att_offset(const ForwardStep& st) const { return st.n_tokens * R(); }
  std::int64_t pre_offset(const ForwardStep& st) const {
    return att_offset(st) + st.n_tokens * Hq_ * head_value_width();
  }
  std::int64_t extra_offset(const ForwardStep& st) const {
    return pre_offset(st) + (st.capture ? st.n_tokens * (Hq_ + Hkv_) * D_ : 0);
  }
  /// Width of the Q|K|V row.
  std::int64_t R() const { return (Hq_ + Hkv_) * D_ + value_cache_width(); }

  const LlamaLayer* L_;
  std::int64_t E_, Hq_, Hkv_, D_, n_rot_;
  std::int64_t window_ = 0;  ///< W of a local layer, 0 = global
  RopeLayout rope_layout_;
  double attn_scale_ = 0;    ///< 0 = 1/√D
  double rms_eps_;
};

}  // namespace numattn
