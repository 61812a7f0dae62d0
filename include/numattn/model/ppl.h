/// @file ppl.h
/// Perplexity and KL divergence of a model on a token stream, llama.cpp's protocol
/// (`tools/perplexity/perplexity.cpp`).
///
/// Protocol: the stream is cut into `n_chunk = min(chunks, n_tokens / ctx)` chunks of `ctx`
/// tokens (the remainder is dropped); each chunk runs from an empty KV cache, with its first
/// token replaced by BOS (see `BosMode`); only the second half is scored: with
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
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/model/llama.h"

namespace numattn {

/// What happens to the first token of each chunk.
enum class BosMode {
  kReplace,  ///< always replaced by BOS (the project's default)
  kAuto,     ///< replaced only if the vocabulary's add_bos_token is set (llama.cpp exactly)
  kKeep,     ///< never replaced
};
BosMode parse_bos_mode(const std::string& s);  ///< "replace" | "auto" | "keep"

struct PplOptions {
  std::int64_t ctx = 512;
  std::int64_t chunks = -1;         ///< -1 = all that fit
  std::string attn = "exact.flash";
  std::string baseline;             ///< empty = no KL divergence (unless baseline_model)
  /// Optional second model for the baseline passes (e.g. the dense model of a BDA run); its
  /// attention is `baseline`, or `attn` when `baseline` is empty. Same hyper-parameters.
  LlamaModel* baseline_model = nullptr;
  BosMode bos = BosMode::kReplace;
  bool progress = false;            ///< a progress bar on stderr
  /// Called after each chunk, outside the timed forward passes (e.g. to sample the BLAS
  /// throughput under the same machine load as the run).
  std::function<void()> after_chunk;
};

struct PplResult {
  std::int64_t ctx = 0, chunks = 0, tokens_scored = 0, tokens_processed = 0;
  double nll_mean = 0, ppl = 0, ppl_stderr = 0;
  bool has_baseline = false;
  double kld_mean = 0, kld_p99 = 0, top1_agreement = 0;
  double ppl_baseline = 0;
  double seconds = 0;        ///< forward passes of `attn` only (the baseline is not counted)
  double tokens_per_s = 0;   ///< tokens_processed / seconds
  ForwardProfile profile;    ///< phase times of the `attn` passes
  std::vector<double> nll;   ///< per scored token, in order
};

/// Natural-log log-softmax of one row of logits (float64 accumulation).
void log_softmax(const float* logits, std::int64_t n, std::vector<double>& out);

/// Runs the protocol on `tokens`. `bos_id`/`add_bos` come from the tokenizer. The model's
/// attention is set to `opt.attn` (and temporarily to the baseline).
PplResult evaluate_perplexity(LlamaModel& model, const std::vector<std::int32_t>& tokens,
                              std::int32_t bos_id, bool add_bos, const PplOptions& opt,
                              const ExecContext& ctx);

}  // namespace numattn
