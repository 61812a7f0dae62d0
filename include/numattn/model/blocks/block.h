/// @file block.h
/// The blocks a decoder model is a stack of: normalisations, attention forms and feed-forward
/// forms, each stating its weights, its KV-cache bytes per token and its FLOPs.
///
/// A decoder layer (DecoderLayer) is pre-norm attention then pre-norm feed-forward:
/// ```
///   x += Attention(Norm_a(x));   x += Ffn(Norm_f(x))
/// ```
/// (with post-norms, each sub-block's output normalised before its add).
/// The model (model/llama.h) runs one loop over its layers; every form of attention (GQA with
/// RoPE, BD-V, factored VO heads, MLA) and of feed-forward (SwiGLU) is a block class of its own
/// (model/blocks/*.h), built from the model's weights by its architecture's builder.
///
/// Execution: a forward call of N tokens runs an attention block in three steps so that a
/// prefill needs two synchronisation points per layer:
///   1. `project` (per block of token rows, in parallel over the team's threads): queries into
///      the block's scratch rows, keys and values appended to the layer's cache;
///   2. `attend` (the whole team): attention of the N queries over the cache;
///   3. `output` (per block of token rows): x += the output projection of the attention rows.
/// Scratch: each block says how many floats per token its steps share (scratch_per_token); the
/// model gives each layer its own rows, alive from its `project` to its `output`.
/// A normalisation and a feed-forward block work on token rows only (per block of rows).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "numattn/attention/method.h"
#include "numattn/core/exec.h"
#include "numattn/core/tensor.h"
#include "numattn/quant/qgemv.h"

namespace numattn {

/// Seconds spent per phase of the forward pass, accumulated over calls (a cheap profile).
/// In a prefill split over threads by tokens, phases are timed on the first thread and
/// `sync` is the time it then waits for the others (load imbalance, preemption).
struct ForwardProfile {
  double embed = 0, norm = 0, qkv_gemm = 0, rope = 0, attention = 0, o_gemm = 0,
         ffn_gemm = 0, ffn_act = 0, output_gemm = 0, sync = 0;
  double total() const;
};

/// Q/K/V of one layer for the N tokens of one forward call, handed to a capture callback.
/// Views are `[1, H, N, D]` (H = Hq for q, Hkv for k/v) and valid only during the call.
/// A layer without per-head Q/K/V of that shape (MLA, factored VO heads) carries `xn` only (the
/// views are empty).
struct QkvCapture {
  int layer = 0;
  std::int64_t pos0 = 0;  ///< position of the first of the N tokens
  /// The layer's normalised input Xn = RMSNorm(X) ⊙ attn_norm, `[N, E]` row-major (what Wq, Wk,
  /// Wv multiply; the TransMLA calibration accumulates its covariance).
  const float* xn = nullptr;
  TensorView<const float> q_pre, k_pre;    ///< before RoPE (after the per-head q/k norms of a qk_norm model)
  TensorView<const float> q_post, k_post;  ///< after RoPE (what attention sees)
  TensorView<const float> v;
};
using CaptureFn = std::function<void(const QkvCapture&)>;

/// How an MLA layer runs (model/mla_model.h).
enum class MlaExec { kNaive, kAbsorbed };

/// What one forward call gives every block.
struct ForwardStep {
  std::int64_t n_tokens = 0;  ///< N, the new tokens of the call
  std::int64_t pos0 = 0;      ///< position of the first of them (tokens already cached)
  ExecContext team;           ///< the whole team (attend)
  /// The team inside one block of token rows: one thread when a prefill splits the tokens over
  /// the team, else the team (a decode step splits each product over output features).
  ExecContext rows_ctx;
  bool by_tokens = false;     ///< a prefill split over threads by tokens
  Activations act = Activations::kF32;  ///< activations of products with in-place weights
  MlaExec mla_exec = MlaExec::kAbsorbed;
  bool capture = false;       ///< a capture callback is set: keep pre-RoPE copies
  /// cos and sin of position pos0 + t times frequency i at [t·rope_half + i] (the model's RoPE
  /// table of the call; rope_half = n_rot/2 frequencies).
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  /// The same for the local layers' RoPE base (ModelHParams::rope_base_local), when the model
  /// has local layers.
  const float* rope_cos_local = nullptr;
  const float* rope_sin_local = nullptr;
  std::int64_t rope_half = 0;
  ForwardProfile* profile = nullptr;

  /// Adds the seconds since the last lap to `slot` when `main` (the first thread times the
  /// phases) and profiling. Blocks get the step as const; only the first thread laps, so the
  /// clock below is written by one thread.
  void lap(bool main, double ForwardProfile::*slot) const;
  /// When the last lap ended (set by the model at the start of the call).
  mutable std::chrono::steady_clock::time_point t0{};
};

/// Floats per token of one layer's cache: a key side and a value side (MLA: the latent rows in
/// `k`, nothing in `v`; factored VO heads: one shared value row).
struct CacheShape {
  std::int64_t k = 0, v = 0;
  bool operator==(const CacheShape&) const = default;
};

/// One layer's cache rows: `[capacity, shape.k]` and `[capacity, shape.v]`, row-major, in
/// float32 (`k`, `v`) or, when `type` is kF16 / kBf16, in 16-bit halves (`k16`, `v16`; `k` and
/// `v` are then null).
struct LayerCache {
  float* k = nullptr;
  float* v = nullptr;
  CacheShape shape;
  KvType type = KvType::kF32;
  std::uint16_t* k16 = nullptr;
  std::uint16_t* v16 = nullptr;
};

/// RMSNorm or another normalisation of token rows.
class NormBlock {
 public:
  virtual ~NormBlock() = default;
  /// y[t] = Norm(x[t]) for n rows of width `width()` (x == y allowed).
  virtual void apply(const float* x, float* y, std::int64_t n) const = 0;
  virtual std::int64_t width() const = 0;
  virtual std::string kind() const = 0;
};

/// An attention form (see the file comment for the three steps).
class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  /// "gqa", "bd-v", "factored-vo", "mla".
  virtual std::string kind() const = 0;
  /// Linear-layer weights a token multiplies through (projections in and out).
  virtual std::int64_t weights() const = 0;
  /// Bytes of those weights a token reads (in place: their encoding; float32: 4 per weight).
  virtual std::uint64_t weight_bytes() const = 0;
  /// FLOPs per token at a context of n_ctx cached tokens: 2·weights() plus the attention
  /// products (2·Hq·n_ctx·(d_qk + d_v) for exact attention).
  virtual double flops_per_token(std::int64_t n_ctx) const = 0;
  virtual CacheShape cache_shape() const = 0;
  /// Keys a query sees in a local (sliding-window) layer, itself included; 0 = all (global).
  virtual std::int64_t window() const { return 0; }
  /// KV-cache bytes per token with elements of type `t`.
  std::int64_t cache_bytes_per_token(KvType t = KvType::kF32) const {
    return kv_type_bytes(t) * (cache_shape().k + cache_shape().v);
  }
  /// Whether the block's cache can hold elements of type `t` (float32 always; half precision
  /// where attend reads it: the GQA forms, not MLA's latent rows).
  virtual bool supports_cache(KvType t) const { return t == KvType::kF32; }
  /// Scratch floats per token that the three steps share.
  virtual std::int64_t scratch_per_token(const ForwardStep& st) const = 0;
  /// Step 1 for token rows [t0, t1): xn rows `[N, E]` of the call (row t at xn + t·E).
  virtual void project(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1,
                       const LayerCache& cache, float* scratch, bool main) const = 0;
  /// Step 2 over the first pos0 + N cache rows, with `method`, on st.team (a block may keep a
  /// small decode step on one thread: waking the team would cost more than the work).
  virtual void attend(const ForwardStep& st, const AttentionMethod& method, const LayerCache& cache,
                      float* scratch) const = 0;
  /// Step 3 for token rows [t0, t1): x rows `[N, E]` += the output projection.
  virtual void output(const ForwardStep& st, std::int64_t t0, std::int64_t t1, float* scratch, float* x,
                      bool main) const = 0;
  /// Hands the layer's capture to `fn` after step 1 (xn only when the form has no per-head
  /// Q/K/V).
  virtual void capture(const ForwardStep& st, int layer, const float* xn, const float* scratch,
                       const CaptureFn& fn) const;
};

/// A feed-forward form.
class FfnBlock {
 public:
  virtual ~FfnBlock() = default;
  virtual std::string kind() const = 0;
  virtual std::int64_t weights() const = 0;
  virtual std::uint64_t weight_bytes() const = 0;
  double flops_per_token() const { return 2.0 * static_cast<double>(weights()); }
  virtual std::int64_t scratch_per_token() const = 0;
  /// x rows [t0, t1) += Ffn(xn rows).
  virtual void forward(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1, float* scratch,
                       float* x, bool main) const = 0;
};

/// One decoder layer as blocks. With post-norms (Gemma), each sub-block's output is
/// normalised before the residual add: x += attn_post_norm(Attention(attn_norm(x))), likewise
/// for the FFN; without them (nullptr) x += Attention(attn_norm(x)).
struct DecoderLayer {
  std::shared_ptr<const NormBlock> attn_norm;
  std::shared_ptr<const AttentionBlock> attn;
  std::shared_ptr<const NormBlock> attn_post_norm;
  std::shared_ptr<const NormBlock> ffn_norm;
  std::shared_ptr<const FfnBlock> ffn;
  std::shared_ptr<const NormBlock> ffn_post_norm;
};

}  // namespace numattn
