/// @file hparams.h
/// The hyper-parameters of a decoder-only transformer, as the GGUF keys of its architecture give
/// them (model/arch.h reads them), and the checks every model and weight rewrite relies on.
/// This layer sits below model/ and transform/: the weight rewrites (BDA, TransMLA, tensor
/// compression) and the model both use it, neither includes the other's headers for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace numattn {

/// The GGUF keys of the hyper-parameters, after the architecture's prefix (`<arch>.`), as
/// llama.cpp names them (LLM_KV_*); arch_key() in arch/arch.h joins the two.
namespace hparam_key {
inline constexpr const char* kEmbd = "embedding_length";
inline constexpr const char* kBlocks = "block_count";
inline constexpr const char* kFf = "feed_forward_length";
inline constexpr const char* kHeads = "attention.head_count";
inline constexpr const char* kHeadsKv = "attention.head_count_kv";
inline constexpr const char* kKeyLength = "attention.key_length";
inline constexpr const char* kValueLength = "attention.value_length";
inline constexpr const char* kRot = "rope.dimension_count";
inline constexpr const char* kRopeBase = "rope.freq_base";
inline constexpr const char* kRopeScaling = "rope.scaling.type";
inline constexpr const char* kRmsEps = "attention.layer_norm_rms_epsilon";
inline constexpr const char* kContext = "context_length";
inline constexpr const char* kVocab = "vocab_size";
inline constexpr const char* kSlidingWindow = "attention.sliding_window";
inline constexpr const char* kSlidingWindowPattern = "attention.sliding_window_pattern";
inline constexpr const char* kRopeBaseLocal = "rope.freq_base_swa";
inline constexpr const char* kLogitSoftcap = "final_logit_softcapping";
}  // namespace hparam_key

/// How RoPE pairs the dimensions of a head (llama.cpp's rope types).
enum class RopeLayout {
  kAdjacent,  ///< LLAMA_ROPE_TYPE_NORM: pairs (x[2i], x[2i+1]) (Llama GGUF files)
  kHalves,    ///< LLAMA_ROPE_TYPE_NEOX: pairs (x[i], x[i + n_rot/2]) (rotate-half; Gemma)
};
/// The gate function of the gated feed-forward: x += W_down·(g(W_gate·xn) ⊙ W_up·xn).
enum class FfnGate {
  kSilu,      ///< SwiGLU: g(a) = a·σ(a) (Llama)
  kGeluTanh,  ///< GeGLU: g(a) = a/2·(1 + tanh(√(2/π)·(a + 0.044715·a³))) (Gemma)
};

/// Largest `<arch>.context_length` accepted: 2^24 tokens (the longest trained contexts are
/// around 10^7); anything larger is a corrupt or hostile file.
inline constexpr std::int64_t kMaxContextLength = std::int64_t{1} << 24;

/// Hyper-parameters (GGUF `<arch>.*` keys; `llama.*` for Llama).
struct ModelHParams {
  /// `general.architecture`: the prefix of the GGUF keys below (messages name the keys with it).
  std::string arch = "llama";
  /// The GGUF key of hyper-parameter `field` (a hparam_key constant): "<arch>.<field>".
  std::string key(const char* field) const { return arch + "." + field; }
  std::int64_t n_vocab = 0;
  std::int64_t n_embd = 0;      ///< E
  std::int64_t n_layer = 0;     ///< L
  std::int64_t n_ff = 0;        ///< F
  std::int64_t n_head = 0;      ///< Hq
  std::int64_t n_head_kv = 0;   ///< Hkv
  std::int64_t head_dim = 0;    ///< D (attention.key_length, default E/Hq)
  std::int64_t n_rot = 0;       ///< rope.dimension_count (default D)
  double rope_base = 10000.0;   ///< rope.freq_base
  double rms_eps = 1e-5;        ///< attention.layer_norm_rms_epsilon
  std::int64_t n_ctx_train = 0; ///< context_length (trained context, tokens)

  // What distinguishes the decoder forms numattn runs (arch/arch.h sets them per architecture;
  // the defaults are Llama's).
  RopeLayout rope_layout = RopeLayout::kAdjacent;
  FfnGate ffn_gate = FfnGate::kSilu;
  /// Per-head RMSNorm of q and k after their projections, before RoPE (weights attn_q_norm,
  /// attn_k_norm of width D): Gemma 3 (Team Gemma, "Gemma 3 Technical Report", 2025).
  bool qk_norm = false;
  /// RMSNorm of the attention and the feed-forward outputs before each residual add
  /// (post_attention_norm, post_ffw_norm): x += Norm(Attention(Norm(x))).
  bool post_norms = false;
  /// Token embeddings are multiplied by this (float32) before the first layer (Gemma: √E).
  double embed_scale = 1.0;
  /// Softmax scale of every layer's attention; 0 = 1/√D.
  double attn_scale = 0;
  /// logits = c·tanh(logits / c) when c > 0 (`final_logit_softcapping`); 0 = none.
  double logit_softcap = 0;
  /// Sliding-window (local) layers: query at position i sees keys i − sliding_window + 1 .. i
  /// (llama.cpp's LLAMA_SWA_TYPE_STANDARD), and rotates by rope_base_local. `local_layers[ℓ]`
  /// = 1 marks one; empty = no local layer.
  std::int64_t sliding_window = 0;
  double rope_base_local = 10000.0;  ///< rope.freq_base_swa
  std::vector<std::uint8_t> local_layers;
  bool is_local(std::int64_t layer) const {
    return !local_layers.empty() && local_layers[static_cast<std::size_t>(layer)] != 0;
  }
  /// RoPE base of layer ℓ.
  double layer_rope_base(std::int64_t layer) const { return is_local(layer) ? rope_base_local : rope_base; }
  /// What this model's attention adds to Llama's, as a phrase ("per-head q/k RMSNorm, RoPE over
  /// halves, sliding-window layers"); empty for Llama's form. Weight rewrites derived for that
  /// form (MLA conversion, which rebuilds keys from a latent, and files in numattn's Llama-keyed
  /// layouts) refuse a model with any.
  std::string attention_extras() const;
  /// Rows of the stacked Wq|Wk|Wv matrix: (Hq + 2·Hkv)·D.
  std::int64_t qkv_rows() const { return (n_head + 2 * n_head_kv) * head_dim; }
  /// Number of weights of the linear layers of one layer (what a token multiplies through).
  std::int64_t layer_weights() const;
  /// float32 values of all weights: embeddings, norms, every layer, and the output matrix
  /// unless `tied`. Checked arithmetic (throws numattn::Error on overflow).
  std::int64_t weight_count(bool tied) const;
  /// Throws numattn::Error, naming the field and its GGUF key (prefixed by `source`, e.g. the
  /// file, when given), unless: every count is >= 1; head_count is a multiple of
  /// head_count_kv; n_rot (rope.dimension_count) is even, >= 0 and <= head_dim; rms_eps is
  /// finite and in (0, 1); rope_base is finite and > 0; 1 <= n_ctx_train <= kMaxContextLength;
  /// embed_scale is finite and > 0, attn_scale and logit_softcap finite and >= 0,
  /// rope_base_local finite and > 0, local_layers empty or one flag per layer, and
  /// sliding_window >= 1 when a layer is local;
  /// and every weight size fits in 64 bits. After it, qkv_rows() and layer_weights() cannot
  /// overflow.
  /// The keys are named with `arch` (numattn's own architectures keep the llama keys under their
  /// own name).
  void validate(const std::string& source = "") const;
};

}  // namespace numattn
