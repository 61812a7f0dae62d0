/// @file bda.h
/// BD Attention (BDA): the exact weight-level rewrite of one attention layer by Basis
/// Decomposition (J. Zhao, "Accelerating Attention with Basis Decomposition", arXiv 2510.01718,
/// 2025).
///
/// Per KV head g, with T_g = W_k^g[S,:]^{-1} (QK pair) or T_g = W_v^g[S,:]^{-1} (VO pair) and one
/// basis S of dh input channels shared by all heads of the layer:
///   QK:  K'_g = K_g·T_g   (identity side: X[:,S] + X[:,S^c]·C_g, one fused GEMM for all heads)
///        W_q'^j = W_q^j·W_k^g[S,:]ᵀ for every query head j of group g   → Q'_j·K'_gᵀ = Q_j·K_gᵀ
///   VO:  V'_g = V_g·T_g   (identity side, same kernel)
///        W_o'^j = W_v^g[S,:]·W_o^j                                    → P·V'_g·W_o'^j = P·V_g·W_o^j
/// The identity always sits on the *shared* K/V side, so GQA/MQA sharing is kept (one C_g per KV
/// head, Q and O stay per query head). The K and V weights shrink by dh/d; Q and O keep their
/// size. The KV cache must hold K' and V' (same size as K and V).
///
/// Biases (exact identities):
///   b_q' = b_q^j·W_k^g[S,:]ᵀ;  b_k: dropped (adds q·b_k, a per-query constant that softmax
///   ignores; logits and LSE shift, probabilities do not) or transformed b_k·T_g (keeps logits);
///   b_v: folded into b_o' = b_o + Σ_j b_v^{g(j)}·W_o^j (exact when every query row sees at
///   least one key; wrong for sink / off-by-one softmax) or transformed b_v·T_g (always exact).
///
/// RoPE: Q'K'ᵀ = QKᵀ needs T_g to commute with every rotation R(p), which a generic T does not,
/// so the QK pair is refused when any dimension of the head is rotary (`rope_dims > 0`); the VO
/// pair never carries RoPE and is always allowed. (MLA/decoupled RoPE: pass the position-free
/// "nope" slice as the Q/K weights with rope_dims = 0.)
///
/// Numerics: everything is computed in float64 from the float32 weights and stored in float32.
/// Rounding is amplified by κ_g = cond(W^g[S,:]); a KV head with κ_g > `kappa_threshold` keeps
/// its dense form on both sides of the pair (the fused kernel handles mixed heads), and the
/// report lists κ_g and the fallback per head. docs/bd.md gives the tolerance c·u·κ_max.
///
/// ## How the model layer applies `--bda vo` at load time
/// For a Llama layer stored as in model/llama.h (`wqkv` = [(Hq+2Hkv)·D, E] rows of Wq|Wk|Wv,
/// `wo` = [E, Hq·D], all `[out, in]` row-major float32), once per layer after dequantisation:
/// ```
///   transform::AttentionLayerWeights w;
///   w.d_model = E; w.heads = Hq; w.kv_heads = Hkv; w.head_dim = D; w.rope_dims = n_rot;
///   w.layout = transform::WeightLayout::kOutIn;
///   const float* p = layer.wqkv.data();
///   w.wq = {p, Hq*D*E};  w.wk = {p + Hq*D*E, Hkv*D*E};  w.wv = {p + (Hq+Hkv)*D*E, Hkv*D*E};
///   w.wo = layer.wo;
///   transform::BdaOptions opt;  opt.pairs = transform::parse_bda_pairs("vo");
///   transform::BdaLayer bda = transform::bda_transform(w, opt);  // float64 inside, ~ms
///   layer.wo = bda.wo;            // W_o' = W_v^g[S,:]·W_o^j, same [E, Hq·D] shape
///   // drop the Wv rows from wqkv (Q|K stay one stacked GEMM) and keep bda.v_proj.
/// ```
/// Forward, Xn = normalised hidden states [N, E] row-major:
/// ```
///   Q|K = Xn·[Wq;Wk]ᵀ  (unchanged, then RoPE as before: the QK pair is untouched by "vo")
///   bda.v_proj.project(Xn, N, E, V, Hkv·D, transform::InputOrder::kOriginal, ctx);  // V'
///   A = attention(Q, K, V')  (cache V' instead of V: same size)
///   X += A·Woᵀ with Wo = bda.wo (already stored in layer.wo)
/// ```
/// Threads: the model's prefill runs BLAS multi-threaded, so pass ExecContext{1} to project()
/// (one block, BLAS's own threads); threads > 1 makes the kernel parallelise itself and set
/// BLAS to one thread (bd_projection.h).
/// `InputOrder::kOriginal` gathers Xn into [S, S^c] order per token block (one extra read of
/// N·E floats); a model that permutes its residual stream offline can pass kPermuted.
/// `bda.vo.heads[g].dense` says which KV heads fell back (their V and W_o are unchanged);
/// `bda.vo.kappa_max` bounds the float32 error (docs/bd.md). For "qk"/"qkvo" use bda.wq and
/// bda.k_proj the same way (refused when rope_dims > 0).
#pragma once

#include <limits>
#include <span>
#include <string>
#include <vector>

#include "numattn/decomp/basis_decomposition.h"
#include "numattn/transform/bd_projection_builder.h"

namespace numattn::transform {

/// Which pairs to rewrite: "none", "qk", "vo", "qkvo".
enum class BdaPairs { kNone = 0, kQK = 1, kVO = 2, kQKVO = 3 };
BdaPairs parse_bda_pairs(const std::string& s);
const char* to_string(BdaPairs p);
inline bool has_qk(BdaPairs p) { return (static_cast<int>(p) & 1) != 0; }
inline bool has_vo(BdaPairs p) { return (static_cast<int>(p) & 2) != 0; }

/// Memory layout of a weight matrix of a projection y = x·W, x ∈ R^{in}, y ∈ R^{out}.
/// - kInOut: W is [in, out] row-major (y = x·W).
/// - kOutIn: W is [out, in] row-major (y = x·Wᵀ; PyTorch nn.Linear and GGUF order).
enum class WeightLayout { kInOut, kOutIn };

/// One attention layer's float32 weights (non-owning). With H = heads, G = kv_heads, dh =
/// head_dim (query head j uses KV head j / (H/G); head h owns output columns h·dh .. h·dh+dh):
///   wq: d_model → H·dh,  wk, wv: d_kv → G·dh,  wo: H·dh → d_model   (each in `layout`)
///   bq: H·dh, bk, bv: G·dh, bo: d_model   (each optional: empty span = no bias)
struct AttentionLayerWeights {
  index_t d_model = 0;
  index_t d_kv = 0;  ///< input dim of K and V (0 = d_model; e.g. the MLA latent otherwise)
  index_t heads = 0, kv_heads = 0, head_dim = 0;
  index_t rope_dims = 0;  ///< rotary dimensions per Q/K head (0 = no RoPE, head_dim = LLaMA)
  WeightLayout layout = WeightLayout::kInOut;
  std::span<const float> wq, wk, wv, wo;
  std::span<const float> bq, bk, bv, bo;
  index_t eff_d_kv() const { return d_kv > 0 ? d_kv : d_model; }
};

enum class KeyBias { kDrop, kTransform };
enum class ValueBias { kFoldIntoOutput, kTransform };

struct BdaOptions {
  BdaPairs pairs = BdaPairs::kVO;
  /// Shared-basis rule; automatic = maxmin over the KV heads (pivoted QR for one KV head).
  decomp::BasisStrategy strategy = decomp::BasisStrategy::kAutomatic;
  /// KV heads with κ above this keep their dense form (+inf: never fall back). 1e4 keeps the
  /// float32 error below about c·u·1e4 ≈ 1e-2 relative in the worst case; lower it for
  /// half-precision storage (the rounding error grows like u·κ).
  double kappa_threshold = 1e4;
  KeyBias key_bias = KeyBias::kDrop;
  ValueBias value_bias = ValueBias::kFoldIntoOutput;
};

/// One pair's outcome.
struct BdaPairReport {
  bool applied = false;
  std::vector<index_t> basis;        ///< S (input channels of K or V), sorted
  std::vector<BdHeadReport> heads;   ///< per KV head: κ and dense fallback
  double kappa_max = 1;              ///< over the BD (non-fallback) heads
  index_t fallback_heads = 0;
};

/// The BDA form of a layer. wq/bq/wo/bo replace the originals (same shapes and layout);
/// k_proj/v_proj replace the K/V projections (dense when their pair is not applied).
struct BdaLayer {
  index_t d_model = 0, d_kv = 0, heads = 0, kv_heads = 0, head_dim = 0;
  WeightLayout layout = WeightLayout::kInOut;
  std::vector<float> wq, bq, wo, bo;  ///< bq/bo empty when the layer has none and none is needed
  BdProjection k_proj, v_proj;
  BdaPairReport qk, vo;
  bool key_bias_dropped = false;  ///< logits differ from the original by a per-row constant
  index_t params_before = 0, params_after = 0;  ///< weights of the four projections
};

/// Rewrites one layer. Throws numattn::Error for inconsistent shapes, for the QK pair with
/// rotary dimensions (RoPE), and for head_dim > d_kv. Cost: O(dh·d_kv·G·dh) for the maxmin
/// selection plus O(dh²·(d_model·H + d_kv·G)) for the new weights, all in float64.
BdaLayer bda_transform(const AttentionLayerWeights& w, const BdaOptions& opt);

}  // namespace numattn::transform
