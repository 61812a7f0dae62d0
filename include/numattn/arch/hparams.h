/// @file hparams.h
/// The hyper-parameters of a decoder-only transformer, as the GGUF keys of its architecture give
/// them (model/arch.h reads them), and the checks every model and weight rewrite relies on.
/// This layer sits below model/ and transform/: the weight rewrites (BDA, TransMLA, tensor
/// compression) and the model both use it, neither includes the other's headers for it.
#pragma once

#include <cstdint>
#include <string>

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
}  // namespace hparam_key

/// Largest `llama.context_length` accepted: 2^24 tokens (the longest trained contexts are
/// around 10^7); anything larger is a corrupt or hostile file.
inline constexpr std::int64_t kMaxContextLength = std::int64_t{1} << 24;

/// Hyper-parameters (GGUF `<arch>.*` keys; `llama.*` for Llama).
struct ModelHParams {
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
  /// and every weight size fits in 64 bits. After it, qkv_rows() and layer_weights() cannot
  /// overflow.
  /// `arch` is the key prefix of the messages (`general.architecture`: "llama", or numattn's own
  /// architectures, which keep the llama keys under their own name).
  void validate(const std::string& source = "", const std::string& arch = "llama") const;
};

}  // namespace numattn
