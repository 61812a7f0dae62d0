/// @file mla_weights.h
/// Multi-head latent attention (MLA, DeepSeek-V2 §2.1) weights of one decoder layer: the form a
/// GQA layer takes after the TransMLA conversion (transform/mla.h), and what the model runs.
///
/// For the normalised hidden states Xn `[N, E]` of a layer (after attn_norm), per token:
/// ```
///   c        = W_dkv · xn                       [r]        the latent, cached
///   k_rope   = RoPE_θ(W_kr · xn; pos)           [d_rope]   shared by all heads, cached
///   q_nope_h = W_q_nope[h] · xn                 [d_nope]   per query head h < Hq
///   q_rope_h = RoPE_θ(W_q_rope[h] · xn; pos)    [d_rope]
///   k_nope_h = W_uk[h] · c                      [d_nope]
///   v_h      = W_uv[h] · c                      [d_v]
///   s_h(i,j) = softmax_scale · (q_nope_h(i)·k_nope_h(j) + q_rope_h(i)·k_rope(j))
///   o_h      = Σ_j softmax_j(s_h(i,·)) v_h(j);  out = W_o · [o_0 | … | o_{Hq−1}]
/// ```
/// RoPE_θ rotates adjacent pairs (x[2j], x[2j+1]) by pos·rope_theta[j], j < d_rope/2 (the GGUF
/// `llama` layout). Naive execution up-projects k_nope and v for every cached token; absorbed
/// execution folds W_uk[h] into the query (q̃_h = W_uk[h]ᵀ q_nope_h, scores against c directly)
/// and W_uv[h] into W_o, so decode reads only the cache: (r + d_rope) floats per token and layer,
/// against GQA's 2·Hkv·D.
///
/// softmax_scale is the original model's 1/sqrt(head_dim): the conversion preserves the unscaled
/// dot products, so the scale does not follow d_nope + d_rope.
#pragma once

#include <cstdint>
#include <vector>

namespace numattn {

/// One layer's MLA weights, float64 (the conversion's precision; the model casts at load).
/// Matrices are row-major `[out, in]`; E is the model width. Any of d_nope, d_rope may be 0.
struct MlaLayerWeights {
  std::int64_t n_head = 0;  ///< Hq
  std::int64_t rank = 0;    ///< r = d_c, latent width per token (>= 1)
  std::int64_t d_nope = 0;  ///< per-head key width without RoPE
  std::int64_t d_rope = 0;  ///< width of the shared RoPE key (even)
  std::int64_t d_v = 0;     ///< per-head value width (W_o is [E, Hq·d_v])
  double softmax_scale = 0;
  std::vector<double> rope_theta;  ///< [d_rope/2] angular frequency of each pair (rad / position)
  std::vector<double> w_dkv;       ///< [r, E]
  std::vector<double> w_kr;        ///< [d_rope, E]
  std::vector<double> w_q_nope;    ///< [Hq·d_nope, E]  (head-major rows)
  std::vector<double> w_q_rope;    ///< [Hq·d_rope, E]
  std::vector<double> w_uk;        ///< [Hq·d_nope, r]
  std::vector<double> w_uv;        ///< [Hq·d_v, r]
  /// KV-cache floats per token of this layer: r + d_rope.
  std::int64_t cache_width() const { return rank + d_rope; }
};

}  // namespace numattn
