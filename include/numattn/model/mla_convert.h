/// @file mla_convert.h
/// A whole Llama model converted to MLA (TransMLA, transform/mla.h) at load, its calibration,
/// and MLA models stored as GGUF (architecture `numattn-mla`).
///
/// Calibration (`calibrate_mla`): calibration tokens run through the GQA model in chunks from
/// an empty cache; a capture hook (QkvCapture::xn) accumulates, per layer, Σ_t xn_t xn_tᵀ in
/// float64 (one DGEMM per chunk and layer), divided by T at the end: MlaCalibration::xn_cov.
/// Cost: the forward passes plus 2·L·T·E² flops; memory L·E² doubles (10 MB for SmolLM2-135M).
///
/// Conversion (`convert_model_to_mla`): each layer's Wq, Wk, Wv (dequantized when held in
/// place, one layer at a time) → transform::convert_layer_to_mla → MlaLayer (float32);
/// W_o, the norms and the FFN stay as they are (the conversion keeps d_v = D).
///
/// GGUF form (`write_mla_gguf`, read back by LlamaModel::load; docs/model-runner.md):
/// `general.architecture = "numattn-mla"`, every `llama.*` key of the source renamed
/// `numattn-mla.*` (the GQA hyper-parameters, kept for validation and KV-cache comparisons),
/// plus
/// - `numattn-mla.mla.version` (u32, 1), `numattn-mla.mla.kv_lora_rank` (u32) r,
///   `numattn-mla.mla.nope_dim` (u32) d_nope, `numattn-mla.mla.rope_dim` (u32) d_rope,
///   `numattn-mla.mla.value_dim` (u32) d_v, `numattn-mla.mla.softmax_scale` (f64), and the options
///   used, `numattn-mla.mla.freqfold` (i32), `numattn-mla.mla.rope_heads` (i32),
///   `numattn-mla.mla.rank_option` (i64). The loader checks each key's range and their relations
///   (d_v = D, d_rope = rope_heads·n_rot, d_nope = Hkv·D − d_rope, r = the latent width cut to
///   rank_option, scale 1/sqrt(D), θ from freqfold and rope_heads; docs/model-runner.md), so the
///   writer refuses layers and options that do not satisfy them;
/// - per layer ℓ, `numattn-mla.mla.rope_theta.ℓ` (f64 array [d_rope/2], rad per position) and
///   F32 tensors (GGUF ne order {in, out}; rows as in arch/mla_weights.h):
///   `blk.ℓ.attn_kv_a_mqa.weight` {E, r + d_rope}: rows W_dkv then W_kr;
///   `blk.ℓ.attn_q.weight` {E, Hq·(d_nope + d_rope)}: per head h, rows W_q_nope[h] then W_q_rope[h];
///   `blk.ℓ.attn_kv_b.weight` {r, Hq·(d_nope + d_v)}: per head h, rows W_uk[h] then W_uv[h];
///   the source's `attn_k`/`attn_v` are dropped; everything else is copied unchanged.
/// The layout follows llama.cpp's `deepseek2` tensor names and per-head row order, but the file
/// cannot be a `deepseek2` model: llama.cpp's deepseek2 graph applies the RMSNorm
/// `attn_kv_a_norm` to the latent before the up-projections (kv_cmpr = RMSNorm(c)·γ, then
/// wkv_b / wk_b), i.e. every cached token's k_nope and v are divided by rms(c_j), a per-token
/// factor that no weight (no γ, no W_uk/W_uv) can undo, while the converted layer is linear in c.
/// (Two further mismatches could be absorbed: deepseek2's scale 1/sqrt(d_nope + d_rope), by
/// scaling W_q; and its single geometric RoPE base over d_rope dims, which matches only
/// rope_heads = 1 with freqfold = 1 — repeated or FreqFold-averaged θ do not.)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/model/llama.h"
#include "numattn/transform/mla.h"

namespace numattn {

class GgufFile;

/// Per-layer calibration of `model` (a GQA model: MLA layers are refused) on `tokens`, in
/// chunks of at most `chunk` tokens. `on_chunk(done, total)` is called after each chunk.
/// Throws numattn::Error for fewer than 1 token or a bad chunk size.
std::vector<transform::MlaCalibration> calibrate_mla(
    const LlamaModel& model, const std::vector<std::int32_t>& tokens, std::int64_t chunk,
    const ExecContext& ctx, const std::function<void(std::int64_t, std::int64_t)>& on_chunk = {});

struct MlaModelReport {
  transform::MlaOptions options;
  std::int64_t rank = 0, d_nope = 0, d_rope = 0, d_v = 0;  ///< of layer 0 (all layers agree)
  std::int64_t kv_bytes_gqa = 0, kv_bytes_mla = 0;         ///< per token, all layers, float32
  std::vector<transform::MlaConversionStats> layers;
  double seconds = 0;
};

/// Converts every layer of `model` in place (all or nothing: a throw leaves it unchanged).
/// `calib` has one entry per layer (or is empty: identity statistics). `on_layer(l, L)` after
/// each layer.
MlaModelReport convert_model_to_mla(LlamaModel& model,
                                    const std::vector<transform::MlaCalibration>& calib,
                                    const transform::MlaOptions& opt, const ExecContext& ctx,
                                    const std::function<void(std::int64_t, std::int64_t)>& on_layer = {});

/// Writes `mla_model` (converted from the model in `source` with `opt`) as a `numattn-mla`
/// GGUF file (layout above), atomically; refuses `path` == the source file.
/// `transform`: the canonical transform pipeline it was made with (transform/pipeline.h), stored
/// under `numattn.transform` when not empty.
void write_mla_gguf(const GgufFile& source, const LlamaModel& mla_model,
                    const transform::MlaOptions& opt, const std::string& path, const std::string& transform = "");

}  // namespace numattn
