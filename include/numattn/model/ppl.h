/// @file ppl.h
/// Perplexity and KL divergence of a model on a token stream, llama.cpp's protocol
/// (`tools/perplexity/perplexity.cpp`).
///
/// Protocol: the stream is cut into `n_chunk = min(chunks, n_tokens / ctx)` chunks of `ctx`
/// tokens (the remainder is dropped); each chunk runs from an empty KV cache, with its first
/// token replaced by BOS when the vocabulary says add_bos_token, as llama.cpp does (see
/// `BosMode`); only the second half is scored: with
/// `first = ctx / 2`, the logits at positions `first .. ctx-2` predict tokens
/// `first+1 .. ctx-1`, so `ctx - 1 - first` tokens per chunk (255 at ctx 512).
/// `PPL = exp(mean NLL)`; its standard error is llama.cpp's:
/// `PPL · sqrt((E[nll²] − E[nll]²) / (n − 1))`.
///
/// Against a baseline attention spec the same chunks also run with the baseline and each
/// scored position gives `KL(p_base ‖ p) = Σ p_base (log p_base − log p)` (natural log, as
/// llama.cpp's `--kl-divergence`); reported: mean, 99th percentile, and the fraction of
/// positions where both argmaxes agree (top-1 agreement).
///
/// Cost: per chunk one forward pass of `ctx` tokens (two with a baseline), plus the output
/// GEMM for `ctx - 1 - first` rows only (logits are computed only where they are scored).
///
/// The model is not modified: the attention specs reach the forward passes through
/// ForwardOptions::attention, so an exception (a bad spec, a non-finite logit, a callback that
/// throws) leaves the model as it was.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "numattn/core/cancel.h"
#include "numattn/core/exec.h"
#include "numattn/model/llama.h"

namespace numattn {

/// What happens to the first token of each chunk.
enum class BosMode {
  kAuto,     ///< replaced by BOS only if the vocabulary's add_bos_token is set: the file's own
             ///< rule, as llama.cpp does (the default)
  kReplace,  ///< always replaced by BOS, whatever the file says
  kKeep,     ///< never replaced
};
/// "auto" | "replace" | "keep"; throws OptionError("bos") otherwise.
BosMode parse_bos_mode(const std::string& s);
const char* to_string(BosMode m);

struct PplOptions {
  std::int64_t ctx = 512;           ///< tokens per chunk, >= 4
  std::int64_t chunks = -1;         ///< -1 = all that fit, else >= 1
  /// Evaluate with ctx beyond the model's trained context (<arch>.context_length); refused
  /// otherwise, since positions past it were never trained.
  bool allow_long_ctx = false;
  std::string attn = "exact.flash";
  std::string baseline;             ///< empty = no KL divergence (unless baseline_model)
  /// Optional second model for the baseline passes (e.g. the dense model of a BDA run); its
  /// attention is `baseline`, or `attn` when `baseline` is empty. Same hyper-parameters.
  const LlamaModel* baseline_model = nullptr;
  BosMode bos = BosMode::kAuto;
  /// Element types of the KV caches of the evaluated and the baseline passes. When they differ
  /// the chunks also run with the baseline's cache (the same attention and model unless
  /// `baseline` / `baseline_model` say otherwise), so the KL divergence measures the cache
  /// type's cost (`ppl --kv f16` against float32).
  KvType kv = KvType::kF32, baseline_kv = KvType::kF32;
  bool progress = false;            ///< a progress bar on stderr (when it is a terminal)
  /// Called after each chunk, outside the timed forward passes (e.g. to sample the BLAS
  /// throughput under the same machine load as the run).
  std::function<void()> after_chunk;
  /// Evaluate only the chunks for which this returns true (unset: all). A distributed run gives
  /// each rank its share of the chunks and reduces the per-token values (dist/ppl.h).
  std::function<bool(std::int64_t chunk)> run_chunk;
  /// Checked before each chunk (core/cancel.h): a cancelled run throws Cancelled ("ppl: stopped
  /// after c of n chunks") or the poll's own exception, and returns nothing.
  const CancelToken* cancel = nullptr;
};

struct PplResult {
  std::string attn_spec;      ///< canonical spec list of `attn`
  std::string baseline_spec;  ///< canonical spec list of the baseline passes (empty: none)
  KvType kv = KvType::kF32, baseline_kv = KvType::kF32;  ///< the caches' element types
  std::int64_t ctx = 0, chunks = 0, tokens_scored = 0, tokens_processed = 0;
  double nll_mean = 0, ppl = 0, ppl_stderr = 0;
  bool has_baseline = false;
  double kld_mean = 0, kld_p99 = 0, top1_agreement = 0;
  double ppl_baseline = 0;
  double seconds = 0;        ///< forward passes of `attn` only (the baseline is not counted)
  double tokens_per_s = 0;   ///< tokens_processed / seconds
  ForwardProfile profile;    ///< phase times of the `attn` passes
  std::vector<double> nll;   ///< per scored token, in order
  /// Per scored token, in order, with a baseline only: KL(p_base ‖ p), the baseline's NLL, and
  /// whether both argmaxes agree (1 or 0).
  std::vector<double> kld, base_nll;
  std::vector<std::uint8_t> agree;
};

/// Fills the statistics of `r` (tokens_scored, nll_mean, ppl, ppl_stderr and, with
/// `r.has_baseline`, kld_mean, kld_p99, top1_agreement, ppl_baseline) from its per-token vectors,
/// summing in their order, so that a distributed run that gathers the same vectors in chunk
/// order reports bitwise the single-process statistics. Also tokens_per_s from
/// tokens_processed / seconds.
void summarize_perplexity(PplResult& r);

/// Natural-log log-softmax of one row of logits (float64 accumulation).
void log_softmax(const float* logits, std::int64_t n, std::vector<double>& out);

/// Checks `opt` with what is known so far, so that a caller can refuse bad options before
/// loading a model or reading a text: always ctx >= 4, chunks == -1 or >= 1 and that `attn`
/// and `baseline` parse; with `hp` (LlamaModel::read_hparams reads it without the weights)
/// also that ctx fits the trained context unless allow_long_ctx, and that spec lists have 1 or
/// n_layer entries; with `n_tokens` >= 0 also that the text has at least 2·ctx tokens.
/// Throws OptionError naming the option (ctx, chunks, attn, baseline) or numattn::Error.
void check_ppl_options(const PplOptions& opt, const ModelHParams* hp = nullptr,
                       std::int64_t n_tokens = -1);

/// Runs the protocol on `tokens` (after check_ppl_options). `bos_id`/`add_bos` come from the
/// tokenizer. Throws numattn::Error naming the chunk and position of a non-finite logit.
PplResult evaluate_perplexity(const LlamaModel& model, const std::vector<std::int32_t>& tokens,
                              std::int32_t bos_id, bool add_bos, const PplOptions& opt,
                              const ExecContext& ctx);

}  // namespace numattn
