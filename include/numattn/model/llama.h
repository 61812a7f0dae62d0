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
/// The model runs as blocks (model/blocks/block.h): each layer a DecoderLayer of RmsNorm, an
/// attention block (GqaAttention, or BdvAttention / FactoredVoAttention / MlaAttention when a
/// weight rewrite changed the layer) and SwigluFfn, built from the weights below by the llama
/// family's builder (arch/arch.h names the architectures of that family). LlamaWeights is the
/// data; the blocks point into it, so edits go through edit_weights, which rebuilds them.
///
/// RoPE: llama.cpp's `LLAMA_ROPE_TYPE_NORM` for `llama` (src/llama-model.cpp,
/// `llama_model_rope_type`): rotation of adjacent pairs with θ_i = pos · base^(−2i/n_rot),
/// i < n_rot/2 (`rope.dimension_count`, `rope.freq_base`); dims past n_rot are left alone.
/// This is right for GGUF files because llama.cpp's `convert_hf_to_gguf.py` permutes the rows
/// of HF's q/k weights (which use the rotate-half layout) into the interleaved one.
/// GQA: query head h reads KV head h / (Hq/Hkv) (contiguous groups).
///
/// Storage (WeightStorage): by default the linear-layer weights and the embeddings stay in their
/// GGUF encoding, read in place from the memory-mapped file (QuantMatrix, quant/qgemv.h), with
/// Wq|Wk|Wv stacked as one matrix of three parts and W_gate|W_up as one of two; only the norm
/// vectors (and a BDA file's float32 projection) are copied. Loading is then parsing and
/// validation, and a decode step reads each weight's 4.5–8.5 bits once. `kF32` dequantizes every
/// weight at load into float32 row-major `[out, in]` matrices (the exactness reference).
/// A decode step (few tokens) multiplies the blocks directly (quant_gemv); a prefill dequantizes
/// panels of rows into an L2-resident float32 tile feeding blas::sgemm (quant_linear), so both
/// storages run the same 4 GEMMs per layer and agree up to float32 summation order.
/// Threads: one team (our `parallel_for`), BLAS single-threaded inside it. A prefill gives each
/// thread a contiguous block of tokens for everything but attention (norms, GEMMs on its rows,
/// RoPE, SwiGLU), so a layer has two synchronisation points; attention runs through the
/// registry method, parallel over heads. A decode step (few tokens) splits each GEMM over
/// output features instead. OpenBLAS's own thread pool is not used: its workers spin after a
/// GEMM and would compete with the team for the same cores.
/// Cost per token: 2·(weights of all linear layers) FLOPs + attention (≈ 4·n_ctx·D per head).
/// Memory: the mapped file's pages (≈ 94 MB for SmolLM2-135M Q4_1, shared with the page cache;
/// 4 bytes per weight, ≈ 540 MB, with kF32) + KV cache 2·L·Hkv·D·n_ctx floats.
/// Every one of these allocations (kF32 weights at load, the KV cache, a forward call's activations
/// and logits) is sized with checked arithmetic and compared with the machine's available
/// memory first (core/memory.h): a request that does not fit is refused by a numattn::Error
/// that gives both numbers, never a std::bad_alloc.
///
/// Untrusted files: `load` validates every hyper-parameter (ranges, divisibility, finite
/// positive rms_eps and rope.freq_base, context_length) and checks it against the shapes and
/// types of the tensors it sizes *before* allocating anything, so the sizes it allocates are
/// those of tensors that lie inside the file. Errors name the file, the GGUF key and the
/// tensor. kF32: dequantized weights must be finite (the first NaN/Inf is named by tensor and
/// index). In place, weights are not scanned at load (that would read the whole file); a
/// non-finite weight then shows as a non-finite logit, which forward() refuses by position.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "numattn/attention/method.h"
#include "numattn/core/memory.h"
#include "numattn/core/exec.h"
#include "numattn/arch/hparams.h"
#include "numattn/core/tensor.h"
#include "numattn/model/blocks/block.h"
#include "numattn/quant/qgemv.h"
#include "numattn/transform/bd_projection.h"

namespace numattn {

class GgufFile;
struct MlaLayer;

/// How a loaded model holds its weights.
enum class WeightStorage {
  kInPlace,  ///< GGUF encoding, read from the memory-mapped file (default; `--weights gguf`)
  kF32,      ///< dequantized to float32 at load (`--weights f32`, the exactness reference)
};
/// "gguf" / "f32" (the CLI's `--weights` values).
const char* weight_storage_name(WeightStorage s);
/// Parses "gguf" or "f32"; throws numattn::Error naming both.
WeightStorage parse_weight_storage(const std::string& name);

/// One decoder layer's weights, row-major `[out, in]`: each linear layer is either a float32
/// vector or (in place) the QuantMatrix beside it, never both.
struct LlamaLayer {
  std::vector<float> attn_norm;  ///< [E]
  std::vector<float> wqkv;       ///< [(Hq+2Hkv)·D, E]: rows of Wq, then Wk, then Wv
                                 ///< ([(Hq+Hkv)·D, E], Wq|Wk only, when v_bd is set)
  /// BD Attention, VO pair (model/bda_model.h): when set, the value projection is this fused
  /// BD projection (V' = V·T per KV head, what the cache then holds) and `wo` holds W_o'.
  std::shared_ptr<const transform::BdProjection> v_bd;
  /// In-place storage of v_bd's coefficients (apply_bda on weights held in place): C_stackᵀ,
  /// [Hkv·D, E − D], re-quantized to the source value tensor's GGUF type, which quant_linear
  /// multiplies by xn[S^c]; v_bd keeps the basis and the dense heads. Empty: v_bd's float32
  /// coefficients.
  QuantMatrix v_bd_q;
  /// The bytes of matrices a weight rewrite re-quantized (v_bd_q, a BDA layer's W_o'), which
  /// their QuantMatrix parts point into; shared by copies of the layer.
  std::vector<std::shared_ptr<const std::vector<std::uint8_t>>> owned_bytes;
  /// MLA (model/mla_model.h): when set, this layer's attention is the MLA layer: wqkv, wqkv_q
  /// and v_bd are empty, `wo` is [E, Hq·d_v], and the layer's cache holds [c | k_rope] rows.
  std::shared_ptr<const MlaLayer> mla;
  /// Factored collaborative VO heads (model/tensor_model.h, `vo-cp:...,exec=factored`): when
  /// non-empty, [Hq, R] per-head mixing vectors μ_h; wqkv is then [(Hq+Hkv)·D + R, E] (rows of
  /// Wq, Wk, then the shared value projection V'), `wo` is O' [E, R], the layer's value cache
  /// holds one R-wide row U = V'·xn per token, and head h's output is (P_h·U) ⊙ μ_h, summed over
  /// the heads before O'.
  std::vector<float> vo_mix;
  std::int64_t vo_rank = 0;      ///< R of a factored VO layer (0: none)
  std::vector<float> wo;         ///< [E, Hq·D] ([E, Hq·d_v] for an MLA layer, [E, R] with vo_mix)
  std::vector<float> ffn_norm;   ///< [E]
  /// Per-head norms of q and k ([D] each; ModelHParams::qk_norm) and the norms of the attention
  /// and FFN outputs ([E] each; ModelHParams::post_norms); empty when the model has none.
  std::vector<float> attn_q_norm, attn_k_norm, attn_post_norm, ffn_post_norm;
  std::vector<float> w_gate_up;  ///< [2F, E]: rows of W_gate, then W_up
  std::vector<float> w_down;     ///< [E, F]
  /// In-place storage of the same matrices (empty with float32 storage): parts Wq, Wk, Wv
  /// (Wq, Wk when v_bd is set); Wo; W_gate, W_up; W_down.
  QuantMatrix wqkv_q, wo_q, w_gate_up_q, w_down_q;
};

struct LlamaWeights {
  std::vector<float> token_embd;   ///< [V, E] (empty in place)
  std::vector<float> output_norm;  ///< [E]
  std::vector<float> output;       ///< [V, E]; empty = tied to token_embd (or held in place)
  std::vector<LlamaLayer> layers;
  QuantMatrix token_embd_q, output_q;  ///< in place; output_q empty = tied
  /// The mapped file the QuantMatrix parts point into (kept alive with the weights, so a copy
  /// of the model or of its weights stays valid).
  std::shared_ptr<const GgufFile> file;
  /// True when the output matrix is token_embd (no output.weight in the file).
  bool tied() const { return output.empty() && output_q.empty(); }
  /// True when any matrix is held in place.
  bool in_place() const { return !token_embd_q.empty(); }
};

/// Keys and values of all layers for the tokens seen so far; positions are 0..n_past-1.
/// Each layer holds the rows its attention block asks for (AttentionBlock::cache_shape): a GQA
/// layer K and V `[capacity, Hkv, D]`, an MLA layer one `[capacity, r + d_rope]` array of
/// [c | k_rope] rows in k() and nothing in v(), a factored VO layer K and one R-wide value row.
/// Elements are float32 or, by `type`, IEEE binary16 / bfloat16 (k16(), v16(); k() and v() are
/// then null): half the bytes per token, each value rounded once to nearest even on append
/// (docs/numerics.md, "Half-precision KV cache").
class KvCache {
 public:
  KvCache() = default;
  /// GQA layers: 2·L·max_tokens·Hkv·D elements.
  KvCache(const ModelHParams& hp, std::int64_t max_tokens, KvType type = KvType::kF32);
  /// One layer per shape. Throws numattn::Error if max_tokens < 1, if the size overflows, or if
  /// it exceeds the available memory (both numbers named).
  KvCache(const std::vector<CacheShape>& layers, std::int64_t max_tokens, KvType type = KvType::kF32);
  /// Bytes one token occupies over all layers (its element size times the widths).
  std::int64_t bytes_per_token() const { return bytes_per_token_; }
  std::int64_t n_past() const { return n_past_; }
  std::int64_t capacity() const { return capacity_; }
  KvType type() const { return type_; }
  /// Forget everything (positions restart at 0); keeps the memory.
  void clear() { n_past_ = 0; }
  /// Layer ℓ's keys / values, row-major (token-major): float32 (null for a half cache) ...
  /// (null also for a layer that holds no such rows).
  float* k(int layer) { return type_ == KvType::kF32 ? array<float>(k_at_, layer) : nullptr; }
  float* v(int layer) { return type_ == KvType::kF32 ? array<float>(v_at_, layer) : nullptr; }
  /// ... or half precision (null for a float32 cache).
  std::uint16_t* k16(int layer) { return type_ == KvType::kF32 ? nullptr : array<std::uint16_t>(k_at_, layer); }
  std::uint16_t* v16(int layer) { return type_ == KvType::kF32 ? nullptr : array<std::uint16_t>(v_at_, layer); }
  const std::vector<CacheShape>& shapes() const { return shapes_; }

 private:
  friend class LlamaModel;
  std::int64_t n_past_ = 0, capacity_ = 0, bytes_per_token_ = 0;
  KvType type_ = KvType::kF32;
  // Every layer's arrays in one mapping on huge pages: a decode step streams each layer's rows
  // once, and one layer's arrays (a few MiB or less) would each be too small for a huge page of
  // their own, leaving a TLB miss every 4 KiB; a sparse decode reads a few rows of each page.
  std::vector<std::byte, HugePageAllocator<std::byte>> store_;
  std::vector<std::size_t> k_at_, v_at_;  ///< byte offset of each layer's array; npos when empty
  template <class T>
  T* array(const std::vector<std::size_t>& at, int layer) {
    const std::size_t o = at[static_cast<std::size_t>(layer)];
    return o == static_cast<std::size_t>(-1) ? nullptr : reinterpret_cast<T*>(store_.data() + o);
  }
  std::vector<CacheShape> shapes_;
};

/// Attention methods of a forward pass: one for all layers, or one per layer.
using AttentionMethods = std::vector<std::shared_ptr<const AttentionMethod>>;
/// The attention of every layer of a loaded model until set_attention changes it.
inline constexpr const char* kDefaultModelAttention = "exact.flash";
/// Builds the methods of a spec list, in one of three forms:
/// - one spec for all layers ("exact.flash");
/// - one per layer, separated by ';' (or by ',' outside parentheses): "exact.naive;exact.flash;...";
/// - layer selectors `local:SPEC` and/or `global:SPEC` (e.g. "global:kernel.performer(features=256)"):
///   SPEC runs the model's local (sliding-window) or global layers (`local` = ModelHParams::
///   local_layers); a kind not named keeps kDefaultModelAttention. A local layer's problem
///   carries the model's window (window_left = W − 1: GqaAttention), so a method given to local
///   layers runs that window (one that cannot refuses the layer when it runs).
/// With `n_layer` > 0 a plain list must have 1 or `n_layer` entries; with 0 only the specs are
/// checked (to validate options before a model is loaded). Every layer gets its own instance
/// (one spec is created once per layer: methods may keep per-layer state, auto.select). Throws
/// numattn::Error for a bad spec or count, for `local:` on a model without local layers and
/// for `global:` on one whose layers are all local.
AttentionMethods make_attention_methods(const std::string& spec, std::int64_t n_layer,
                                        const std::vector<std::uint8_t>& local = {});
/// The canonical spec list of `methods`: one spec if all layers agree, else
/// "global:A;local:B" when each kind of layer (`local`, as ModelHParams::local_layers) agrees,
/// else one spec per layer.
std::string attention_spec(const AttentionMethods& methods, const std::vector<std::uint8_t>& local = {});

/// Options of one forward call.
struct ForwardOptions {
  /// Logits are returned for the new tokens `[logits_begin, N)` (relative to this call);
  /// 0 = all of them, N-1 = only the last (what generation needs).
  std::int64_t logits_begin = 0;
  CaptureFn capture;               ///< optional: called once per layer
  ForwardProfile* profile = nullptr;  ///< optional: phase times are added here
  /// Attention for this call instead of the model's own (set_attention): one method for all
  /// layers or one per layer (make_attention_methods). Empty = the model's. The model is never
  /// changed, so evaluations with other methods need no mutable model and cannot leave it
  /// altered when they throw.
  AttentionMethods attention;
  /// Return the final normalised hidden rows `[N − logits_begin, E]` (RMSNorm(x) ⊙ output_norm)
  /// instead of logits: logits_from_hidden makes logits from them in any blocks of rows, so a
  /// long chunk's V-wide logits never need to exist at once (Gemma's 262 144 × 8192 rows are
  /// 8.6 GB).
  bool hidden = false;
};

class LlamaModel {
 public:
  /// Reads hyper-parameters (read_hparams: nothing is allocated before it passes), then:
  /// in place, records where each weight lies in the mapped file (no weight is read); kF32,
  /// checks the memory and dequantizes every weight (rows in parallel over `ctx`), refusing a
  /// non-finite one by tensor name and element index. The model keeps `file` alive.
  static LlamaModel load(std::shared_ptr<const GgufFile> file, const ExecContext& ctx = {},
                         WeightStorage storage = WeightStorage::kInPlace);
  /// Opens (memory-maps) `path`, then as above.
  static LlamaModel load(const std::string& path, const ExecContext& ctx = {},
                         WeightStorage storage = WeightStorage::kInPlace);
  /// Float32 storage from a file the caller owns (the model cannot keep a reference to it).
  static LlamaModel load(const GgufFile& file, const ExecContext& ctx = {});
  /// The hyper-parameters of a llama GGUF file, validated (ModelHParams::validate) and checked
  /// against every tensor the model reads: presence, shape ([in, out] in GGUF order, as the
  /// keys give them), and a dequantizable type; `llama.vocab_size` and the tokenizer's token
  /// count must equal token_embd's rows. Reads no weights: cheap enough to check options
  /// against the model before loading it. Throws numattn::Error naming the file, the key and
  /// the tensor; refuses other architectures and RoPE scaling.
  static ModelHParams read_hparams(const GgufFile& file);
  /// From weights in memory (tests, weight transforms). Hyper-parameters are validated and
  /// shapes checked.
  LlamaModel(ModelHParams hp, LlamaWeights w);
  /// Copies and moves rebuild the blocks, which point into the weights of their own model.
  LlamaModel(const LlamaModel& o);
  LlamaModel(LlamaModel&& o) noexcept;
  LlamaModel& operator=(const LlamaModel& o);
  LlamaModel& operator=(LlamaModel&& o) noexcept;

  const ModelHParams& hparams() const { return hp_; }
  const LlamaWeights& weights() const { return w_; }
  /// Edits the weights in place (a weight rewrite: BDA, MLA conversion), then checks the shapes
  /// again and rebuilds the blocks, whose forms follow the edited layers.
  void edit_weights(const std::function<void(LlamaWeights&)>& edit);
  /// The layers as blocks (built by the architecture's builder from the weights).
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  const DecoderLayer& layer(int l) const { return layers_[static_cast<std::size_t>(l)]; }
  /// The float32 output matrix ([V, E]), or nullptr when it is held in place.
  const float* output_matrix() const;
  /// Bytes of weights one token's forward pass reads: every layer's matrices plus, when
  /// `with_output`, the output matrix (in place: encoded bytes; float32: 4 per weight).
  std::uint64_t weight_bytes_per_token(bool with_output = true) const;

  /// Sets the attention method of every layer from a spec list (make_attention_methods, with
  /// the model's local layers). Default: kDefaultModelAttention everywhere.
  void set_attention(const std::string& spec);
  /// The canonical spec list (one spec if all layers agree).
  std::string attention_spec() const;
  const AttentionMethod& attention(int layer) const { return *attn_[static_cast<std::size_t>(layer)]; }

  /// A cache sized for `max_tokens` positions (memory-checked, see KvCache) with elements of
  /// type `type`; MLA layers get their latent width (in that type too). Throws numattn::Error for
  /// a half type when a layer's block keeps float32 rows, naming the layer.
  KvCache make_cache(std::int64_t max_tokens, KvType type = KvType::kF32) const;
  /// KV-cache bytes per token over all layers with elements of type `type`: 2·Hkv·D·4 per GQA
  /// layer in float32 (2·Hkv·D·2 in half precision), (r + d_rope)·4 (·2) per MLA layer.
  std::int64_t kv_bytes_per_token(KvType type = KvType::kF32) const;
  /// Whether any layer is an MLA layer.
  bool has_mla() const;
  /// How MLA layers run (model/mla_model.h); default absorbed.
  void set_mla_exec(MlaExec e) { mla_exec_ = e; }
  MlaExec mla_exec() const { return mla_exec_; }
  /// Activations of the products with weights held in place (quant/qgemv.h, `--activations`):
  /// kF32 (default) or kQ8, where every such product multiplies x̂, x rounded to int8 per
  /// block of 32 (ActivationsQ8): decode products by the integer kernels (Q8_0, Q4_0, Q4_1; the
  /// float kernels for other types), prefill products by the float32 panels on x̂, so prefill
  /// and decode still agree up to summation order. Products with float32 weights (BDA's
  /// projection, float32 MLA and factored layers' own matrices) keep float32 activations. Throws
  /// numattn::Error for kQ8 when no weight is held in place (float32 storage, `--weights f32`:
  /// the exactness reference). Copies of the model keep the setting.
  void set_activations(Activations a);
  Activations activations() const { return act_; }

  /// Runs `tokens` (N of them) at positions cache.n_past()..+N-1, appends their K/V to the
  /// cache, and returns logits `[N - logits_begin, V]` row-major.
  /// Batched prefill and token-by-token decoding give the same result (up to rounding).
  /// Throws numattn::Error for a token id outside the vocabulary, a full cache, activations
  /// that do not fit in the available memory, and a non-finite logit (naming its position
  /// and vocabulary index: with finite weights it means the attention method or the
  /// arithmetic overflowed); after a throw the cache holds the positions it held before.
  std::vector<float> forward(const std::vector<std::int32_t>& tokens, KvCache& cache,
                             const ExecContext& ctx, const ForwardOptions& opt = {}) const;

  /// Logits `[n, V]` of n final hidden rows (ForwardOptions::hidden): the output matrix and the
  /// soft-cap, the same products forward() applies. Throws numattn::Error for a non-finite logit
  /// (naming position pos0 + row) or when the rows do not fit in the available memory.
  std::vector<float> logits_from_hidden(const float* hidden, std::int64_t n, const ExecContext& ctx,
                                        std::int64_t pos0 = 0) const;

  /// Linear-layer weights applied to every token (all layers, not the output matrix).
  /// (MLA layers count their own projections: model/mla_model.h MlaLayer::weights.)
  std::int64_t body_weights() const;
  /// Weights of the output matrix (V·E), applied to each token whose logits are computed.
  std::int64_t output_weights() const { return hp_.n_vocab * hp_.n_embd; }

 private:
  void check_shapes() const;
  void build_blocks();
  /// out `[n, V]` = the output matrix times n hidden rows, soft-capped.
  void project_logits(const float* hidden, std::int64_t n, const ExecContext& ctx, float* out) const;
  /// The work of forward() after its checks (model/llama.cpp).
  struct Call;
  ModelHParams hp_;
  LlamaWeights w_;
  std::vector<DecoderLayer> layers_;
  std::shared_ptr<const NormBlock> output_norm_;
  std::vector<double> rope_inv_freq_;  ///< [n_rot/2], float64 so θ = pos·f stays accurate at long positions
  std::vector<double> rope_inv_freq_local_;  ///< the same for rope_base_local (models with local layers)
  AttentionMethods attn_;
  MlaExec mla_exec_;
  Activations act_ = Activations::kF32;
};

/// Checks a generation request before any work: `max_tokens` >= 1 (OptionError "max_tokens"),
/// and, when `hp` is given and `prompt_tokens` >= 0, that the prompt is not empty, that it fits
/// the trained context (OptionError "prompt") and that prompt + max_tokens does (OptionError
/// "max_tokens", naming the limit <arch>.context_length and the largest allowed value).
void check_generation(std::int64_t max_tokens, std::int64_t prompt_tokens = -1,
                      const ModelHParams* hp = nullptr);

/// Greedy generation with a KV cache of element type `kv`: returns the new token ids (stops at
/// `eos_id` if >= 0). The request is checked by check_generation first.
std::vector<std::int32_t> generate_greedy(const LlamaModel& m, const std::vector<std::int32_t>& prompt,
                                          std::int64_t max_tokens, std::int32_t eos_id,
                                          const ExecContext& ctx,
                                          const std::function<void(std::int32_t)>& on_token = {},
                                          ForwardProfile* profile = nullptr, KvType kv = KvType::kF32);

/// Splits a per-layer spec list on ';' and ',' outside parentheses (attention/registry.h's
/// split_specs, whose errors it throws).
std::vector<std::string> split_spec_list(const std::string& specs);

}  // namespace numattn
