/// @file llama.h
/// Llama-architecture decoder (GGUF `general.architecture = llama`) in float32, with a
/// pluggable attention method per layer, a KV cache and activation capture.
///
/// Per layer ℓ, for the hidden states X `[N, E]` of N new tokens at positions p0..p0+N-1:
/// ```
///   Xn      = RMSNorm(X) ⊙ attn_norm                         RMSNorm(x) = x / sqrt(mean(x²) + eps)
///   Q,K,V   = Xn·Wqᵀ, Xn·Wkᵀ, Xn·Wvᵀ                         [N, Hq·D], [N, Hkv·D], [N, Hkv·D]
///   Q,K     = RoPE(Q, K; positions)                           adjacent pairs (x[2i], x[2i+1])
///   A       = attention_ℓ(Q, K_cache ⊕ K, V_cache ⊕ V)        causal bottom-right, GQA
///   X      += A·Woᵀ
///   X      += W_down·(silu(Xn'·W_gateᵀ) ⊙ Xn'·W_upᵀ)          Xn' = RMSNorm(X) ⊙ ffn_norm
/// ```
/// then `logits = RMSNorm(X) ⊙ output_norm · W_outᵀ` (W_out = token_embd when the file has no
/// `output.weight`, i.e. tied embeddings).
///
/// RoPE: llama.cpp's `LLAMA_ROPE_TYPE_NORM` for `llama` (src/llama-model.cpp,
/// `llama_model_rope_type`): rotation of adjacent pairs with θ_i = pos · base^(−2i/n_rot),
/// i < n_rot/2 (`rope.dimension_count`, `rope.freq_base`); dims past n_rot are left alone.
/// This is right for GGUF files because llama.cpp's `convert_hf_to_gguf.py` permutes the rows
/// of HF's q/k weights (which use the rotate-half layout) into the interleaved one.
/// GQA: query head h reads KV head h / (Hq/Hkv) (contiguous groups).
///
/// Storage: weights are dequantized to float32 at load (quant.h) and kept row-major
/// `[out, in]` (PyTorch Linear layout = GGUF rows), with Wq|Wk|Wv stacked into one matrix and
/// W_gate|W_up into another, so a layer is 4 GEMMs (blas::sgemm) over all N tokens.
/// Threads: one team (our `parallel_for`), BLAS single-threaded inside it. A prefill gives each
/// thread a contiguous block of tokens for everything but attention (norms, GEMMs on its rows,
/// RoPE, SwiGLU), so a layer has two synchronisation points; attention runs through the
/// registry method, parallel over heads. A decode step (few tokens) splits each GEMM over
/// output features instead. OpenBLAS's own thread pool is not used: its workers spin after a
/// GEMM and would compete with the team for the same cores.
/// Cost per token: 2·(weights of all linear layers) FLOPs + attention (≈ 4·n_ctx·D per head).
/// Memory: 4 bytes per weight (≈ 540 MB for SmolLM2-135M) + KV cache 2·L·Hkv·D·n_ctx floats.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "numattn/attention/method.h"
#include "numattn/core/exec.h"
#include "numattn/core/tensor.h"
#include "numattn/transform/bd_projection.h"

namespace numattn {

class GgufFile;

/// Hyper-parameters (GGUF `llama.*` keys).
struct LlamaHParams {
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
  std::int64_t n_ctx_train = 0; ///< context_length
  /// Rows of the stacked Wq|Wk|Wv matrix: (Hq + 2·Hkv)·D.
  std::int64_t qkv_rows() const { return (n_head + 2 * n_head_kv) * head_dim; }
  /// Number of weights of the linear layers of one layer (what a token multiplies through).
  std::int64_t layer_weights() const;
};

/// One decoder layer's float32 weights, row-major `[out, in]`.
struct LlamaLayer {
  std::vector<float> attn_norm;  ///< [E]
  std::vector<float> wqkv;       ///< [(Hq+2Hkv)·D, E]: rows of Wq, then Wk, then Wv
                                 ///< ([(Hq+Hkv)·D, E], Wq|Wk only, when v_bd is set)
  /// BD Attention, VO pair (model/bda_model.h): when set, the value projection is this fused
  /// BD projection (V' = V·T per KV head, what the cache then holds) and `wo` holds W_o'.
  std::shared_ptr<const transform::BdProjection> v_bd;
  std::vector<float> wo;         ///< [E, Hq·D]
  std::vector<float> ffn_norm;   ///< [E]
  std::vector<float> w_gate_up;  ///< [2F, E]: rows of W_gate, then W_up
  std::vector<float> w_down;     ///< [E, F]
};

struct LlamaWeights {
  std::vector<float> token_embd;   ///< [V, E]
  std::vector<float> output_norm;  ///< [E]
  std::vector<float> output;       ///< [V, E]; empty = tied to token_embd
  std::vector<LlamaLayer> layers;
};

/// Q/K/V of one layer for the N tokens of one forward call, handed to a capture callback.
/// Views are `[1, H, N, D]` (H = Hq for q, Hkv for k/v) and valid only during the call.
struct QkvCapture {
  int layer = 0;
  std::int64_t pos0 = 0;  ///< position of the first of the N tokens
  TensorView<const float> q_pre, k_pre;    ///< before RoPE
  TensorView<const float> q_post, k_post;  ///< after RoPE (what attention sees)
  TensorView<const float> v;
};
using CaptureFn = std::function<void(const QkvCapture&)>;

/// Seconds spent per phase of the forward pass, accumulated over calls (a cheap profile).
/// In a prefill split over threads by tokens, phases are timed on the first thread and
/// `sync` is the time it then waits for the others (load imbalance, preemption).
struct ForwardProfile {
  double embed = 0, norm = 0, qkv_gemm = 0, rope = 0, attention = 0, o_gemm = 0,
         ffn_gemm = 0, ffn_act = 0, output_gemm = 0, sync = 0;
  double total() const;
};

/// Keys and values of all layers for the tokens seen so far; positions are 0..n_past-1.
class KvCache {
 public:
  KvCache() = default;
  KvCache(const LlamaHParams& hp, std::int64_t max_tokens);
  std::int64_t n_past() const { return n_past_; }
  std::int64_t capacity() const { return capacity_; }
  /// Forget everything (positions restart at 0); keeps the memory.
  void clear() { n_past_ = 0; }
  /// Layer ℓ's keys / values, `[capacity, Hkv, D]` row-major (token-major).
  float* k(int layer) { return k_[static_cast<std::size_t>(layer)].data(); }
  float* v(int layer) { return v_[static_cast<std::size_t>(layer)].data(); }

 private:
  friend class LlamaModel;
  std::int64_t n_past_ = 0, capacity_ = 0;
  std::vector<std::vector<float>> k_, v_;
};

/// Options of one forward call.
struct ForwardOptions {
  /// Logits are returned for the new tokens `[logits_begin, N)` (relative to this call);
  /// 0 = all of them, N-1 = only the last (what generation needs).
  std::int64_t logits_begin = 0;
  CaptureFn capture;               ///< optional: called once per layer
  ForwardProfile* profile = nullptr;  ///< optional: phase times are added here
};

class LlamaModel {
 public:
  /// Reads hyper-parameters and dequantizes all weights (rows in parallel over `ctx`).
  /// Refuses other architectures and missing tensors by name.
  static LlamaModel load(const GgufFile& file, const ExecContext& ctx = {});
  static LlamaModel load(const std::string& path, const ExecContext& ctx = {});
  /// From weights in memory (tests, weight transforms). Shapes are checked.
  LlamaModel(LlamaHParams hp, LlamaWeights w);

  const LlamaHParams& hparams() const { return hp_; }
  const LlamaWeights& weights() const { return w_; }
  /// Mutable weights, for weight-level transforms; the shapes must be kept.
  LlamaWeights& mutable_weights() { return w_; }
  const float* output_matrix() const;

  /// Sets the attention method of every layer from a spec: one spec for all layers, or a
  /// list with one spec per layer separated by ';' (or by ',' outside parentheses),
  /// e.g. "exact.flash" or "exact.naive;exact.flash;...". Default: exact.flash everywhere.
  void set_attention(const std::string& spec);
  /// The canonical spec list (one spec if all layers agree).
  std::string attention_spec() const;
  const AttentionMethod& attention(int layer) const { return *attn_[static_cast<std::size_t>(layer)]; }

  /// A cache sized for `max_tokens` positions.
  KvCache make_cache(std::int64_t max_tokens) const { return KvCache(hp_, max_tokens); }

  /// Runs `tokens` (N of them) at positions cache.n_past()..+N-1, appends their K/V to the
  /// cache, and returns logits `[N - logits_begin, V]` row-major.
  /// Batched prefill and token-by-token decoding give the same result (up to rounding).
  std::vector<float> forward(const std::vector<std::int32_t>& tokens, KvCache& cache,
                             const ExecContext& ctx, const ForwardOptions& opt = {}) const;

  /// Linear-layer weights applied to every token (all layers, not the output matrix).
  std::int64_t body_weights() const { return hp_.layer_weights() * hp_.n_layer; }
  /// Weights of the output matrix (V·E), applied to each token whose logits are computed.
  std::int64_t output_weights() const { return hp_.n_vocab * hp_.n_embd; }

 private:
  void check_shapes() const;
  LlamaHParams hp_;
  LlamaWeights w_;
  std::vector<double> rope_inv_freq_;  ///< [n_rot/2], float64 so θ = pos·f stays accurate at long positions
  std::vector<std::shared_ptr<const AttentionMethod>> attn_;
};

/// Greedy generation with the KV cache: returns the new token ids (stops at `eos_id` if >= 0).
std::vector<std::int32_t> generate_greedy(const LlamaModel& m, const std::vector<std::int32_t>& prompt,
                                          int max_tokens, std::int32_t eos_id,
                                          const ExecContext& ctx,
                                          const std::function<void(std::int32_t)>& on_token = {},
                                          ForwardProfile* profile = nullptr);

/// Splits a per-layer spec list on ';' and on ',' outside parentheses.
std::vector<std::string> split_spec_list(const std::string& specs);

}  // namespace numattn
