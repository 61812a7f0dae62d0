/// @file transform_model.h
/// A transform pipeline (transform/pipeline.h) applied to a loaded Llama model: the one place
/// where the stages of `--transform` (CLI) and `Model.load(transform=...)` (Python) run.
///
/// Stages run in pipeline order on the model in place: `mla` calibrates the GQA model on its
/// text (model/mla_convert.h calibrate_mla, chunks of kMlaCalibChunk tokens, each from an empty
/// cache) and converts every layer; `bda` is apply_bda; `tensor.*` is compress_model_tensor.
/// Front-ends that keep a baseline copy between stages (`ppl` keeps the model before the last
/// stage as its KL baseline) call the stage functions one by one.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "numattn/arch/hparams.h"
#include "numattn/core/exec.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_convert.h"
#include "numattn/model/tensor_model.h"
#include "numattn/model/tokenizer.h"
#include "numattn/transform/pipeline.h"

namespace numattn {

/// Tokens per calibration chunk, the same for every front-end so that they convert a model
/// identically.
inline constexpr std::int64_t kMlaCalibChunk = 512;
/// The largest FreqFold the budget search tries (mla_budget_candidates).
inline constexpr std::int64_t kMaxBudgetFreqfold = 8;

/// The refusals that depend only on the pipeline and the model's header, before its weights are
/// read: `mla` on an MLA file or on attention with per-head extras (a norm of k after its
/// projection cannot act on a shared latent), rope_heads above the KV head count, freqfold not
/// dividing n_rot/2; the tensor stage's check_tensor_spec. Throws numattn::OptionError("transform").
void check_transforms(const transform::TransformPipeline& p, const ModelHParams& hp, bool file_is_mla);

/// One candidate of the budget search and its perplexity on the calibration tokens.
struct MlaBudgetCandidate {
  transform::MlaOptions options;
  double calib_ppl = 0;
};

/// The candidates of `mla(budget=b)` for `hp`: the cache C = round(b·2·Hkv·D) numbers per token
/// and layer split as rope_dims ∈ {n_rot/4, n_rot/2, n_rot, 2·n_rot, …, Hkv·n_rot} plus
/// rank = C − rope_dims (kept when 1 <= rank <= the full latent width), each with freqfold
/// 1, 2, 4, 8 (those dividing n_rot/2; only 1 when every RoPE dim is kept: FreqFold then changes
/// nothing). The cost is linear in the candidates (a conversion and one forward pass of the calibration
/// tokens each), so folds stop at kMaxBudgetFreqfold.
/// Throws OptionError("budget") for b outside (0, 1] or a C with no candidate.
std::vector<transform::MlaOptions> mla_budget_candidates(const ModelHParams& hp, double budget);

struct MlaStageResult {
  MlaModelReport report;            ///< report.options: what was converted (the budget's choice)
  std::vector<MlaBudgetCandidate> candidates;  ///< the budget search, in order (empty without one)
  std::vector<std::pair<double, double>> balance_candidates;  ///< (b, calibration ppl) of the balance search
  std::int64_t calib_tokens = 0;  ///< tokens actually used (the text may be shorter)
  double calib_s = 0;
};

/// The `mla` stage: calibrates `model` (GQA) on the last calib_tokens tokens of the calib text
/// (sequentially or in one pass, MlaStage::calib_mode), converts it in place and sets its MLA
/// execution. With a budget, first the search: every candidate (mla_budget_candidates) is
/// converted with one-pass statistics and scored by perplexity on the calibration tokens alone
/// (chunks of min(512, T/2) tokens, the protocol of model/ppl.h), each line printed on stderr;
/// the lowest is converted. With balance 0 (the default) and a truncating rank, the balance
/// multiplier b (transform/mla.h step 4) is chosen the same way among 1, √2, 2, 2√2, on the
/// two-pass statistics (one-pass for calib_mode sequential), each line
/// printed on stderr. Progress on stderr when `progress` and stderr is a terminal.
MlaStageResult apply_mla_stage(LlamaModel& model, const Tokenizer& tok, const transform::MlaStage& s,
                               const ExecContext& ctx, bool progress);

/// What apply_transforms did, per stage present.
struct TransformReport {
  std::optional<MlaStageResult> mla;
  std::optional<ModelBdaReport> bda;
  std::optional<TensorModelReport> tensor;
};

/// Every stage of `p` in order, in place (check_transforms first).
TransformReport apply_transforms(LlamaModel& model, const Tokenizer& tok, const transform::TransformPipeline& p,
                                 const ExecContext& ctx, bool progress = false);

}  // namespace numattn
