#include "numattn/model/transform_model.h"

#include <algorithm>
#include <chrono>

#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/core/progress.h"
#include "numattn/model/data.h"
#include "numattn/model/mla_model.h"

namespace numattn {

void check_transforms(const transform::TransformPipeline& p, const ModelHParams& hp, bool file_is_mla) {
  if (p.mla) {
    const transform::MlaStage& m = *p.mla;
    NUMATTN_CHECK_OPTION(!file_is_mla, "transform", "mla: the model is already an MLA model (numattn-mla)");
    NUMATTN_CHECK_OPTION(hp.attention_extras().empty(), "transform",
                         "mla: MLA conversion (TransMLA) applies to Llama-form attention; this model's has {} "
                         "(a per-head norm of k after its projection cannot be applied to a shared latent)",
                         hp.attention_extras());
    NUMATTN_CHECK_OPTION(m.options.rope_heads <= hp.n_head_kv, "transform",
                         "mla: rope_heads={} exceeds the model's {} KV heads ({})", m.options.rope_heads,
                         hp.n_head_kv, hp.key(hparam_key::kHeadsKv));
    NUMATTN_CHECK_OPTION(hp.n_rot >= 2 && (hp.n_rot / 2) % m.options.freqfold == 0, "transform",
                         "mla: freqfold={} does not divide the model's {} RoPE frequencies (n_rot/2)",
                         m.options.freqfold, hp.n_rot / 2);
  }
  if (p.tensor) {
    try {
      check_tensor_spec(*p.tensor, hp, p.mla.has_value() || file_is_mla);
    } catch (const OptionError& e) {
      throw OptionError("transform", e.detail());
    }
  }
}

MlaStageResult apply_mla_stage(LlamaModel& model, const Tokenizer& tok, const transform::MlaStage& s,
                               const ExecContext& ctx, bool progress) {
  NUMATTN_CHECK_OPTION(!model.has_mla(), "transform", "mla: the model is already an MLA model");
  MlaStageResult r;
  const std::string text = read_file(resolve_text_path(s.calib), "mla calib file", kTextInput);
  auto toks = tok.encode(text, false, false);
  NUMATTN_CHECK_OPTION(!toks.empty(), "transform", "mla: the calibration text {} encodes to no token", s.calib);
  const auto n = std::min<std::int64_t>(s.calib_tokens, static_cast<std::int64_t>(toks.size()));
  toks.erase(toks.begin(), toks.end() - n);
  const auto mode = progress ? ProgressBar::Mode::kAuto : ProgressBar::Mode::kOff;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<transform::MlaCalibration> cal;
  {
    ProgressBar bar("mla calibration", (n + kMlaCalibChunk - 1) / kMlaCalibChunk, mode);
    cal = calibrate_mla(model, toks, kMlaCalibChunk, ctx, [&](std::int64_t done, std::int64_t) { bar.set(done); });
  }
  r.calib_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.calib_tokens = n;
  // The source W_q of each layer (in place: bytes in the mapped file that the model keeps), which
  // the quantized MLA query reads through its factored form.
  const MlaWeights storage = parse_mla_weights(s.weights);
  std::vector<QuantMatrix> source_wq;
  const ModelHParams& hp = model.hparams();
  for (const LlamaLayer& L : model.weights().layers)
    source_wq.push_back(L.wqkv_q.empty() ? QuantMatrix{} : L.wqkv_q.first_rows(hp.n_head * hp.head_dim));
  ProgressBar bar("mla conversion", model.hparams().n_layer, mode);
  r.report = convert_model_to_mla(model, cal, s.options, ctx,
                                  [&](std::int64_t done, std::int64_t) { bar.set(done, "layers"); });
  quantize_mla_model(model, source_wq, storage);
  model.set_mla_exec(parse_mla_exec(s.exec));
  return r;
}

TransformReport apply_transforms(LlamaModel& model, const Tokenizer& tok, const transform::TransformPipeline& p,
                                 const ExecContext& ctx, bool progress) {
  check_transforms(p, model.hparams(), model.has_mla());
  TransformReport r;
  if (p.mla) r.mla = apply_mla_stage(model, tok, *p.mla, ctx, progress);
  if (p.bda) r.bda = apply_bda(model, p.bda->pairs, {}, parse_bda_coef(p.bda->coef));
  if (p.tensor) {
    TensorModelReport rep;
    model = compress_model_tensor(model, *p.tensor, ctx, &rep);
    r.tensor = rep;
  }
  return r;
}

}  // namespace numattn
