/// @file mla_model.h
/// MLA layers inside the Llama model runner (model/llama.h): the float32 form the model runs,
/// its two executions, and their float64 transcriptions (the tests' references).
///
/// A LlamaLayer whose `mla` is set has no Wq/Wk/Wv: its attention is the MLA layer of
/// arch/mla_weights.h (latent c = W_dkv·xn, shared RoPE key k_rope = RoPE(W_kr·xn), per-head
/// up-projections W_uk, W_uv; `wo` is then `[E, Hq·d_v]`). Its KV cache holds, per token, the
/// row `[c | k_rope]` (r + d_rope floats) instead of the K and V of its KV heads (2·Hkv·D).
///
/// Executions (MlaExec), equal in real arithmetic:
/// - naive: every cached token's k_nope_h = W_uk[h]·c and v_h = W_uv[h]·c are rebuilt, then
///   ordinary multi-head attention over `[k_nope_h | k_rope]` and v_h (Hq KV heads).
///   Cost per query token: Hq·nk·(d_nope + d_v)·r MACs for the up-projections alone.
/// - absorbed (default): W_uk[h] goes to the query side, q̃_h = W_uk[h]ᵀ·q_nope_h (r values),
///   so s_h(j) = scale·([q̃_h | q_rope_h]·[c_j | k_rope_j]): multi-query attention (one KV head)
///   of key width r + d_rope whose value is the c prefix of the same cached row; W_uv[h] is
///   applied to the head's latent output o_lat_h = Σ_j p_j c_j before W_o, i.e.
///   W_o·[W_uv[0]·o_lat_0 | …]: W_uv is absorbed into the output side. (Multiplying W_o·W_uv
///   out into one [E, Hq·r] matrix would cost E·Hq·r MACs per token instead of
///   Hq·d_v·r + E·Hq·d_v, more whenever r > d_v·E/(E − d_v); the associativity is the same.)
///   A decode step reads only the cache: (r + d_rope)·4 bytes per token and layer.
/// Both run the layer's attention method (AttentionProblem with Dk ≠ Dv and `scale` =
/// softmax_scale), parallel over heads; the projections run per token block like the rest of
/// the forward pass.
///
/// RoPE: pairs (x[2j], x[2j+1]) of q_rope_h and k_rope rotate by pos·rope_theta[j] (float64
/// angles, as the model's own).
///
/// BD Attention on the QK pair of the NoPE part (`apply_bda_mla`, transform/bda.h with
/// d_kv = r, Hq KV heads of width d_nope): W_q_nope[h] becomes W_q_nope'[h] = W_uk[h][:,S]ᵀ·
/// W_q_nope[h] and W_uk[h] becomes [I on S | C_hᵀ on S^c] for one shared set S of d_nope latent
/// channels, so k'_h = c[S] + C_hᵀ·c[S^c] and q'_h·k'_h = q_nope_h·k_nope_h exactly. Naive
/// execution up-projects through the fused BD projection ((r − d_nope)·d_nope MACs per head
/// and token instead of r·d_nope); absorbed execution forms q̃_h = [q'_h on S | C_h·q'_h on
/// S^c] (again (r − d_nope)·d_nope MACs).
///
/// BD Attention on the VO pair (`apply_bda_mla` with "vo"/"qkvo"): head h's value path is
/// W_o,h·W_uv[h]·o_lat_h (W_o,h the [E, d_v] block of W_o, W_uv[h] ∈ R^{d_v×r}), BD's VO form with
/// the latent as the V side's input. Each head gets its own set S_h of d_v latent channels
/// (pivoted QR on W_uv[h], κ-aware): the cache holds c itself and every head reads all of it
/// in both executions (naive rebuilds v_h per head, absorbed has one o_lat_h per head), so a
/// per-head basis costs nothing and keeps each κ_h = cond(W_uv[h][:,S_h]) at its own minimum.
/// With B_h = W_uv[h][:,S_h] and C_h = B_h⁻¹·W_uv[h][:,S_h^c]: W_o,h' = W_o,h·B_h and
/// W_uv'[h] = [I on S_h | C_h on S_h^c], so W_o,h'·W_uv'[h] = W_o,h·W_uv[h] exactly. Naive:
/// v'_h = c[S_h] + C_h·c[S_h^c] per cached token; absorbed: att'_h = o_lat_h[S_h] +
/// C_h·o_lat_h[S_h^c] per query token: (r − d_v)·d_v MACs per head instead of r·d_v (d_v² saved,
/// as are d_v² weights). Heads with κ_h above the threshold keep W_uv[h] and W_o,h (float32
/// error c·u·κ_h, docs/bd.md). r == d_v leaves W_uv'[h] a permutation (no coefficients);
/// d_v > r is refused. BD: J. Zhao, arXiv 2510.01718; figures in docs/latent.md §4.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "numattn/attention/method.h"
#include "numattn/core/exec.h"
#include "numattn/arch/mla_weights.h"
#include "numattn/model/blocks/block.h"
#include "numattn/quant/qgemv.h"
#include "numattn/transform/bd_projection.h"

namespace numattn {

/// Storage of an MLA layer's projections (`mla(weights=...)`): float32 as converted, the source
/// model's GGUF types, or Q8_0 (quantize_mla_layer).
enum class MlaWeights { kF32, kSource, kQ8_0 };
/// "f32" / "source" / "q8_0".
const char* to_string(MlaWeights w);
/// Parses "f32" | "source" | "q8_0"; throws OptionError("weights") otherwise.
MlaWeights parse_mla_weights(const std::string& s);

/// "naive" / "absorbed".
const char* to_string(MlaExec e);
/// Parses "naive" | "absorbed"; throws OptionError("mla-exec") otherwise.
MlaExec parse_mla_exec(const std::string& s);

/// Throws numattn::Error (naming `what` and the field) unless `w` is a consistent MLA layer for
/// model width `E`: n_head, rank, d_v >= 1; d_nope >= 0; d_rope even and >= 0; d_nope + d_rope >= 1;
/// rope_theta has d_rope/2 finite values; softmax_scale finite and > 0; every matrix has its
/// shape and finite values.
void validate_mla_weights(const MlaLayerWeights& w, std::int64_t E, const std::string& what);

/// One MLA layer in float32, as the model runs it.
struct MlaLayer {
  std::int64_t n_head = 0, rank = 0, d_nope = 0, d_rope = 0, d_v = 0;
  double softmax_scale = 0;
  std::vector<double> rope_theta;  ///< [d_rope/2]
  /// [r + d_rope + Hq·d_nope + Hq·d_rope, E]: rows of W_dkv, W_kr, W_q_nope, W_q_rope, so one
  /// GEMM of the normalised input gives c, k_rope (before RoPE), q_nope and q_rope.
  std::vector<float> w_in;
  /// [Hq·d_nope, r]. With uk_bd set: the effective W_uk'[h] = [I on S | C_hᵀ on S^c] (what
  /// dense-fallback heads multiply by, and what to_weights returns).
  std::vector<float> w_uk;
  /// [Hq·d_v, r]. With uv_bd set: the effective W_uv'[h] = [I on S_h | C_h on S_h^c] of BD heads
  /// (W_uv[h] itself for dense-fallback heads), what to_weights returns.
  std::vector<float> w_uv;
  /// BD form of W_uk (apply_bda_mla): projection latent → Hq·d_nope (k'_h = c[S] + C_hᵀ·c[S^c]).
  std::shared_ptr<const transform::BdProjection> uk_bd;
  std::vector<float> uk_bd_rest;  ///< uk_bd's C_stack, (r − d_nope) × Hq·d_nope (absorbed query side)
  /// BD form of W_uv (apply_bda_mla, VO pair): empty, or one single-head projection latent → d_v
  /// per head with that head's own basis S_h (v'_h = c[S_h] + C_h·c[S_h^c]); W_o then holds
  /// W_o,h' = W_o,h·W_uv[h][:,S_h] for the BD heads.
  std::vector<transform::BdProjection> uv_bd;

  /// Quantized storage for the absorbed execution (quantize_mla_layer; empty: float32). The
  /// float32 matrices above stay: they are the conversion's result, which the naive execution,
  /// the BD and tensor rewrites and the GGUF writer read. A layer with a BD form (uk_bd, uv_bd)
  /// does not use this storage (quantized()).
  /// - `q_proj` `[r + d_rope + Q, E]`: W_dkv and W_kr re-quantized, then the query rows: the
  ///   factored form's Q = Hq·D rows of the source model's own W_q (its bytes, in place), or the
  ///   direct form's Q = Hq·(r + d_rope) rows [W_uk[h]ᵀ·W_q_nope[h]; W_q_rope[h]] re-quantized.
  /// - `q_up` (factored form only) `[Hq·(r + d_rope), D]`: per head h, the absorbed query
  ///   up-projection [W_uk[h]ᵀ·A_h; R_h] of the head's source query q_h = W_q[h]·xn, where
  ///   W_q_nope[h] = A_h·W_q[h] and W_q_rope[h] = R_h·W_q[h] (the conversion only mixes and
  ///   rotates query dims, so the MLA query of head h is a linear function of q_h). Cost per
  ///   token Hq·(r + d_rope)·D MACs instead of Hq·(r + d_rope)·E.
  /// - `q_uv` `[Hq·d_v, r]`: W_uv re-quantized.
  QuantMatrix q_proj, q_up, q_uv;
  std::int64_t q_head_dim = 0;  ///< D of q_up (0: the direct form)
  /// The bytes of the re-quantized matrices (shared by copies of the layer).
  std::vector<std::shared_ptr<const std::vector<std::uint8_t>>> q_bytes;
  /// Whether the absorbed execution reads the quantized storage.
  bool quantized() const { return !q_proj.empty() && !uk_bd && uv_bd.empty(); }
  /// The weights the quantized storage multiplies by, float64, as one MLA layer for the float64
  /// transcription: W_dkv, W_kr and W_uv dequantized; d_nope' = r with W_uk' = I and
  /// W_q_nope'[h] = the dequantized (up-projection ∘ source W_q[h]) or direct rows, so that
  /// q_nope'·k_nope' = q̃_h·c exactly as the absorbed execution scores. Throws unless quantized().
  MlaLayerWeights quantized_weights(std::int64_t E) const;

  /// Rows of w_in.
  std::int64_t in_rows() const { return rank + d_rope + n_head * (d_nope + d_rope); }
  /// Cached floats per token: r + d_rope.
  std::int64_t cache_width() const { return rank + d_rope; }
  /// Linear-layer weights a token multiplies through (w_in, W_uk, W_uv; not W_o), as counted by
  /// the absorbed execution (the BD forms of W_uk and W_uv counted as their coefficients; a
  /// quantized layer: q_proj, q_up and q_uv).
  std::int64_t weights(std::int64_t E) const;
  /// Cast of `w` (validated first with model width E).
  static MlaLayer from_weights(const MlaLayerWeights& w, std::int64_t E);
  /// Back to float64 (exactly the float32 values; W_uk in its effective dense form).
  MlaLayerWeights to_weights(std::int64_t E) const;
};

/// Gives `L` (no BD form) its quantized storage (see MlaLayer::q_proj): `big` is the type of the
/// E-wide matrices (W_dkv|W_kr and, in the direct form, the query rows), `small` that of q_up
/// and q_uv (in = D or r). A type whose block does not divide a matrix's width, or that
/// quant.h cannot quantize (the K-quants), is replaced by Q8_0, and by F32 when even Q8_0's
/// block of 32 does not divide it. `source_wq`: the source model's W_q `[Hq·D, E]` in place,
/// whose dequantized values the conversion read (or null): the factored form is used when
/// [W_q_nope[h]; W_q_rope[h]] = B_h·W_q[h] holds for every head to a relative Frobenius residual
/// of 1e-5 (least squares in float64), else the direct form. Cost O(Hq·(r + d_rope)·E·D).
void quantize_mla_layer(MlaLayer& L, std::int64_t E, GgmlType big, GgmlType small, const QuantMatrix* source_wq);

class LlamaModel;

/// Gives every MLA layer of `model` the storage `w`: kF32 leaves the layers as they are; kSource
/// re-quantizes the E-wide matrices to the type of the layer's source W_q (`source_wq[ℓ]`, the
/// GQA model's W_q rows held in place) and q_up, q_uv to Q8_0 (their inputs are only D or r wide,
/// where 4-bit blocks would cost more accuracy than their few bytes save), and keeps the float32
/// layers of a model whose source had float32 weights (empty source_wq[ℓ]); kQ8_0 uses Q8_0
/// throughout. `source_wq` has one entry per layer (or is empty). Layers with a BD form are
/// refused (quantize_mla_layer).
void quantize_mla_model(LlamaModel& model, const std::vector<QuantMatrix>& source_wq, MlaWeights w);

/// Float64 transcription of one MLA layer's attention for `n` tokens at positions p0..p0+n−1
/// that see only each other (causal, an empty cache before them): xn `[n, E]` row-major →
/// `[n, Hq·d_v]` (the input of W_o). Naive: the formulas of arch/mla_weights.h as written; absorbed:
/// q̃_h = W_uk[h]ᵀ q_nope_h scored against c, W_uv[h] applied to Σ_j p_j c_j. Cost
/// O(n·(E·in_rows + n·Hq·r + Hq·r·(d_nope + d_v))).
std::vector<double> mla_attention_f64(const MlaLayerWeights& w, const std::vector<double>& xn,
                                      std::int64_t n, std::int64_t E, std::int64_t p0,
                                      MlaExec exec);

/// The model's float32 path for the same problem, one call (tests): runs the three steps
/// below with a private cache of n tokens (whose first p0 positions are not there: the tokens
/// see only each other, as in mla_attention_f64) and `method` for the attention.
std::vector<float> mla_attention_f32(const MlaLayer& L, const std::vector<float>& xn,
                                     std::int64_t n, std::int64_t E, std::int64_t p0, MlaExec exec,
                                     const AttentionMethod& method, const ExecContext& ctx);

/// Width of one token's query row in the buffer the steps share: absorbed Hq·(r + d_rope),
/// naive Hq·(d_nope + d_rope).
std::int64_t mla_query_width(const MlaLayer& L, MlaExec exec);

/// Step 1, per token block: the projections of xn rows `[n, E]` at positions pos0..: writes
/// `[c | RoPE(k_rope)]` rows into `cache_rows` (row stride cache_width()) and the query rows
/// (mla_query_width floats each) into `q`. `cos_sin` scratch of d_rope floats; `proj` scratch
/// of n·in_rows() floats. `gemm_ctx` splits the GEMMs (ExecContext{1} inside a token block).
/// A quantized layer (absorbed) multiplies through q_proj with activations `act`; `proj` then
/// needs n·q_proj.rows() floats.
void mla_project(const MlaLayer& L, MlaExec exec, const float* xn, std::int64_t n, std::int64_t E,
                 std::int64_t pos0, float* cache_rows, float* q, float* proj,
                 const ExecContext& gemm_ctx, Activations act = Activations::kF32);
/// Floats of mla_project's `proj` scratch per token: in_rows(), or q_proj.rows() when the
/// absorbed execution reads a quantized layer.
std::int64_t mla_proj_width(const MlaLayer& L, MlaExec exec);

/// Step 2: attention of the `n` query rows of `q` (the last n of nk positions, causal
/// bottom-right) over the first `nk` rows of `cache` (row stride cache_width()). Absorbed:
/// writes the latent outputs `[n, Hq, r]` into `out`; naive: the head outputs `[n, Hq·d_v]`
/// (rebuilding k_nope/v for all nk tokens first, in parallel over heads; v'_h through uv_bd
/// when set). Parallel over `ctx`.
/// A half-precision cache (`half.type` f16 or bf16): `cache` is null and the rows are the 16-bit
/// values at `half.k` (same stride); absorbed, the method reads them in place when it can
/// (Capabilities::half_kv: keys and values are the same rows), else a float32 copy of them;
/// naive, they are widened once before the up-projections.
void mla_attend(const MlaLayer& L, MlaExec exec, const float* q, std::int64_t n, const float* cache,
                std::int64_t nk, const AttentionMethod& method, const ExecContext& ctx, float* out,
                const HalfKv& half = {});

/// Step 3, per token block, absorbed only: head outputs `att [n, Hq·d_v]` = W_uv[h]·o_lat_h
/// (with uv_bd: o_lat_h[S_h] + C_h·o_lat_h[S_h^c] for BD heads; quantized: q_uv in place, a
/// decode step's heads split over `ctx`'s threads).
void mla_up_values(const MlaLayer& L, const float* lat, std::int64_t n, float* att,
                   const ExecContext& ctx = ExecContext{1});

/// Floats of `att`/`out` scratch per query token that mla_attend needs: absorbed Hq·r, naive Hq·d_v.
std::int64_t mla_out_width(const MlaLayer& L, MlaExec exec);

}  // namespace numattn
