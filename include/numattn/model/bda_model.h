/// @file bda_model.h
/// BD Attention applied to a whole Llama model, and BDA models stored as GGUF.
///
/// `apply_bda` rewrites every layer with transform::bda_transform (transform/bda.h): for the
/// VO pair the value projection becomes the fused BD projection V' = X[:,S^c]·C + X[:,S]
/// (d_model − head_dim MACs per output instead of d_model) and W_o becomes W_o' = W_v[S,:]·W_o,
/// so P·V'·W_o' = P·V·W_o exactly in real arithmetic; the KV cache holds V' (same size).
/// The QK pair needs position-free Q/K dimensions: Llama applies RoPE to every Q/K dimension,
/// so "qk" and "qkvo" are refused with an error that names RoPE.
///
/// GGUF form (written by `write_bda_gguf`, read back by LlamaModel::load): the source file's
/// metadata and tensors, plus `numattn.bda.pairs = "vo"` (the only value read), `numattn.bda.version
/// = 1` (a larger one is refused as written by a newer numattn), and per BDA layer ℓ:
/// - `blk.ℓ.attn_v_bd.perm`   metadata int32 array [E]: input channels in [S, S^c] order (a
///                            permutation of 0..E−1)
/// - `blk.ℓ.attn_v_bd.dense`  metadata int32 array: KV heads kept dense (κ above threshold),
///                            increasing, at most Hkv, each < Hkv
/// - `blk.ℓ.attn_v_bd.coef`   F32 tensor, GGUF ne {Hkv·D, E − D}: C_stack (rows in S^c order)
/// - `blk.ℓ.attn_v_bd.top`    F32 tensor ne {n_dense·D, D}, only when some head is dense
/// - `blk.ℓ.attn_output.weight` replaced by W_o' in F32; `blk.ℓ.attn_v.weight` removed.
/// Coefficients are stored in float32 (as computed in float64 and rounded once), so a
/// converted model reproduces the in-memory BDA model bit for bit.
#pragma once

#include <string>
#include <vector>

#include "numattn/model/llama.h"
#include "numattn/transform/bda.h"

namespace numattn {

class GgufFile;

struct ModelBdaLayerReport {
  int layer = 0;
  double kappa_max = 1;        ///< over the heads that use BD
  int fallback_heads = 0;      ///< KV heads kept dense
  std::int64_t params_before = 0, params_after = 0;  ///< the layer's Q, K, V, O weights
};

struct ModelBdaReport {
  std::string pairs;
  std::vector<ModelBdaLayerReport> layers;
  std::int64_t params_before = 0, params_after = 0;  ///< summed over layers
  /// MLA models: MACs per token of the latent up-projections (W_uk and W_uv, all layers,
  /// Σ H·(d_nope + d_v)·r) before BDA, and those saved by their BD forms (the identity parts:
  /// d_nope² per head for QK, d_v² per head for VO, none for dense-fallback heads); 0 otherwise.
  /// The unit depends on the execution (model/mla_model.h): absorbed, per query token (q̃_h and
  /// W_uv[h]·o_lat_h); naive, per cached token and forward pass (k_nope_h and v_h rebuilt).
  std::int64_t up_macs_before = 0, macs_saved_per_token = 0;
  double kappa_max = 1;
  int fallback_heads = 0;
  /// GGUF types of the VO coefficients and W_o' ("Q8_0", "F32", "Q4_1+F32" when they differ).
  std::string coef_type;
  std::int64_t params_saved() const { return params_before - params_after; }
};

/// Rewrites every layer of `model` with BDA (`pairs`: "vo"; "qk"/"qkvo" refused for RoPE
/// models). Cost: a few ms per layer in float64. Throws numattn::Error on refusal; the model
/// is unchanged then.
/// An MLA model (model/mla_model.h, apply_bda_mla) takes "qk", "vo" and "qkvo". QK: the NoPE
/// pair of each head (W_q_nope[h], W_uk[h]; the latent is the K side's input, d_kv = r) with one
/// shared basis of d_nope latent channels. VO: the pair (W_uv[h], W_o,h) of each head with the
/// latent as the V side's input and a basis S_h of d_v latent channels per head (W_o becomes
/// float32 W_o'; refused when d_v > r). The KV cache (c, k_rope) is unchanged either way.
///
/// Storage: with weights held in place (WeightStorage::kInPlace) the VO pair's coefficients
/// C_stack (LlamaLayer::v_bd_q) and W_o' are re-quantized, so a quantized model stays quantized:
/// - kQ8_0 (default): to Q8_0. Measured on SmolLM2-135M Q4_1 (Austen, ctx 512, 20 chunks): PPL
///   23.447 against the dense model's 23.323 (KL 0.0079), 5% more bytes per decoded token.
/// - kSource: to the types of the layer's source value and output tensors. C_stack and W_o' mix
///   the heads' channels (through W_v[S,:]⁻¹, κ up to 75 there), so a 4-bit source does not hold
///   them: PPL 203 against 25.38 (ctx 512, 50 chunks) for Q4_1, each matrix alone ×2–×4.
/// - kF32: float32, the exact rewrite of the loaded weights (PPL within 1e-7; 40 MB more per
///   decoded token for SmolLM2).
/// A type numattn cannot write (quant.h quantize_row) or rows that are not whole blocks of it
/// keep float32; the report lists the types (coef_type). write_bda_gguf needs kF32.
enum class BdaCoefStorage { kQ8_0, kSource, kF32 };
/// Parses "q8_0", "source" or "f32" (the CLI's `--bda-coef`); throws numattn::Error naming them.
BdaCoefStorage parse_bda_coef(const std::string& name);
ModelBdaReport apply_bda(LlamaModel& model, const std::string& pairs,
                         const transform::BdaOptions& options = {},
                         BdaCoefStorage coef = BdaCoefStorage::kQ8_0);
/// The MLA part of apply_bda (`rep` carries the pairs; every layer must be MLA).
/// Parameters counted per layer: QK W_q_nope + W_uk, VO W_uv + W_o (W_o' has W_o's size).
ModelBdaReport apply_bda_mla(LlamaModel& model, const transform::BdaOptions& opt, ModelBdaReport rep);

/// The layer ℓ of a per-layer GGUF tensor name "blk.ℓ<suffix>" (e.g. ".attn_v.weight"), or -1
/// when `name` is not of that form. Shared by the writers of transformed models.
std::int64_t gguf_block_index(const std::string& name, const std::string& suffix);

/// Writes `bda_model` (made by apply_bda from the model in `source`) as a GGUF file next to
/// the source's metadata and untouched tensors (see the layout above). The file is written
/// atomically (core/file_io.h); a `path` that is the source file itself is refused.
/// `transform`: the canonical transform pipeline it was made with (transform/pipeline.h), stored
/// under `numattn.transform` when not empty.
void write_bda_gguf(const GgufFile& source, const LlamaModel& bda_model, const std::string& path,
                    const std::string& transform = "");

}  // namespace numattn
