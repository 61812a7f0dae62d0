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
/// Which statistics each layer is converted with (MlaCalibMode):
/// - **two_pass** (the default; TransMLA's order, `calibrate_mla` then `add_latent_statistics`):
///   RoRoPE and RoPE removal (steps 2–3) from one pass over the original model; the latent's PCA
///   (step 4) from a second pass over the model with RoPE removed from every layer but nothing
///   truncated. The PCA then sees the inputs that the RoPE removal of the earlier layers gives,
///   the larger of the two changes at a moderate rank, without chasing the truncation errors of
///   the earlier layers. Cost: two forward passes of the calibration tokens and one conversion.
/// - **sequential** (`convert_model_to_mla_sequential`): layer ℓ's statistics on the model whose
///   layers < ℓ are already converted (RoPE removed and truncated), as in the sequential
///   calibration of GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for
///   Generative Pre-trained Transformers", 2023). The PCA of the latent then keeps what the
///   perturbed inputs carry, not what the original model computes, and on the default model it
///   measured worse than two_pass (docs/latent.md). Cost: L(L+1)/2 layer passes (the pass for
///   layer ℓ stops after its capture), about L/2 forward passes.
/// - **one_pass** (`calibrate_mla` then `convert_model_to_mla`): every layer's statistics from one
///   pass over the original model; the cheapest, used for the candidates of the budget search
///   (model/transform_model.h) and kept for comparison.
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

/// How the statistics of each layer are collected (file comment).
enum class MlaCalibMode { kTwoPass, kSequential, kOnePass };
/// "two_pass" | "sequential" | "one_pass"; throws OptionError("calib_mode") otherwise.
MlaCalibMode parse_mla_calib_mode(const std::string& s);

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

/// The second pass of two_pass: `model` (GQA) converted with `calib` (from calibrate_mla) and
/// `opt` but rank 0 (RoPE removal only), its layer inputs over `tokens` stored in each
/// calib[ℓ].latent_xn_cov. `model` itself is not changed.
void add_latent_statistics(const LlamaModel& model, std::vector<transform::MlaCalibration>& calib,
                           const std::vector<std::int32_t>& tokens, std::int64_t chunk,
                           const transform::MlaOptions& opt, const ExecContext& ctx);

/// Converts every layer of `model` (GQA) in place, sequentially (file comment): layer ℓ's
/// statistics on `tokens` (chunks of at most `chunk`) through the model with layers < ℓ already
/// converted. All or nothing. `on_layer(l, L)` after each layer.
MlaModelReport convert_model_to_mla_sequential(LlamaModel& model, const std::vector<std::int32_t>& tokens,
                                               std::int64_t chunk, const transform::MlaOptions& opt,
                                               const ExecContext& ctx,
                                               const std::function<void(std::int64_t, std::int64_t)>& on_layer = {});

/// Writes `mla_model` (converted from the model in `source` with `opt`) as a `numattn-mla`
/// GGUF file (layout above), atomically; refuses `path` == the source file.
/// `transform`: the canonical transform pipeline it was made with (transform/pipeline.h), stored
/// under `numattn.transform` when not empty.
void write_mla_gguf(const GgufFile& source, const LlamaModel& mla_model,
                    const transform::MlaOptions& opt, const std::string& path, const std::string& transform = "");

}  // namespace numattn
