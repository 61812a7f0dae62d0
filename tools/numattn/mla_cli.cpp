#include "mla_cli.h"

#include <algorithm>
#include <chrono>

#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/core/progress.h"
#include "numattn/model/data.h"
#include "numattn/model/mla_model.h"

namespace numattn::cli {

transform::MlaOptions MlaCliOptions::options() const {
  transform::MlaOptions m;
  m.rank = rank;
  m.freqfold = freqfold;
  m.rope_heads = rope_heads;
  return m;
}

void add_mla_options(CLI::App& sub, MlaCliOptions& o) {
  sub.add_option("--mla-rank", o.rank,
                 "convert the GQA attention to MLA at load (TransMLA, transform/mla.h) with latent "
                 "rank r for the NoPE keys and values; 0 = the full width (exact when --rope-heads "
                 "is the KV head count); -1 = no conversion")
      ->capture_default_str();
  sub.add_option("--freqfold", o.freqfold,
                 "with --mla-rank: M adjacent RoPE frequencies folded into one (must divide n_rot/2)")
      ->capture_default_str();
  sub.add_option("--rope-heads", o.rope_heads,
                 "with --mla-rank: KV heads' worth of RoPE dims kept in the shared RoPE key (1..Hkv)")
      ->capture_default_str();
  sub.add_option("--calib", o.calib,
                 "with --mla-rank: calibration text ('default' = the default text; its last "
                 "--calib-tokens tokens are used, so `ppl --chunks N` from the start does not see "
                 "them)")
      ->capture_default_str();
  sub.add_option("--calib-tokens", o.calib_tokens, "with --mla-rank: calibration tokens")
      ->capture_default_str();
  sub.add_option("--mla-exec", o.exec,
                 "how MLA layers run: absorbed (W_uk on the query side, decode reads only the "
                 "latent cache) or naive (k_nope and v rebuilt from the cache)")
      ->capture_default_str()
      ->check(CLI::IsMember({"naive", "absorbed"}));
}

void check_mla_options(const CLI::App& sub, const MlaCliOptions& o) {
  NUMATTN_CHECK_OPTION(o.rank >= -1, "mla-rank", "must be -1 (off), 0 (full width) or positive, got {}", o.rank);
  if (!o.requested())
    for (const char* f : {"--freqfold", "--rope-heads", "--calib", "--calib-tokens"})
      NUMATTN_CHECK_OPTION(sub.count(f) == 0, std::string(f + 2), "needs --mla-rank");
  NUMATTN_CHECK_OPTION(o.freqfold >= 1, "freqfold", "must be at least 1, got {}", o.freqfold);
  NUMATTN_CHECK_OPTION(o.rope_heads >= 1, "rope-heads", "must be at least 1, got {}", o.rope_heads);
  NUMATTN_CHECK_OPTION(o.calib_tokens >= 1, "calib-tokens", "must be at least 1, got {}", o.calib_tokens);
  parse_mla_exec(o.exec);
}

void check_mla_against_model(const MlaCliOptions& o, const ModelHParams& hp, bool file_is_mla) {
  if (!o.requested()) return;
  NUMATTN_CHECK_OPTION(!file_is_mla, "mla-rank", "the model is already an MLA model (numattn-mla)");
  NUMATTN_CHECK_OPTION(hp.attention_extras().empty(), "mla-rank",
                       "MLA conversion (TransMLA) applies to Llama-form attention; this model's has {} "
                       "(a per-head norm of k after its projection cannot be applied to a shared latent)",
                       hp.attention_extras());
  NUMATTN_CHECK_OPTION(o.rope_heads <= hp.n_head_kv, "rope-heads",
                       "{} exceeds the model's {} KV heads ({})",
                       o.rope_heads, hp.n_head_kv, hp.key(hparam_key::kHeadsKv));
  NUMATTN_CHECK_OPTION(hp.n_rot >= 2 && (hp.n_rot / 2) % o.freqfold == 0, "freqfold",
                       "{} does not divide the model's {} RoPE frequencies (n_rot/2)", o.freqfold,
                       hp.n_rot / 2);
}

MlaCliResult convert_for_cli(LlamaModel& model, const Tokenizer& tok, const MlaCliOptions& o,
                             std::int64_t chunk, const ExecContext& ctx, bool progress) {
  MlaCliResult r;
  const std::string text = read_file(resolve_text_path(o.calib), "--calib file", kTextInput);
  auto toks = tok.encode(text, false, false);
  NUMATTN_CHECK_OPTION(!toks.empty(), "calib", "the calibration text encodes to no token");
  const auto n = std::min<std::int64_t>(o.calib_tokens, static_cast<std::int64_t>(toks.size()));
  toks.erase(toks.begin(), toks.end() - n);
  const auto mode = progress ? ProgressBar::Mode::kAuto : ProgressBar::Mode::kOff;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<transform::MlaCalibration> cal;
  {
    ProgressBar bar("mla calibration", (n + chunk - 1) / chunk, mode);
    cal = calibrate_mla(model, toks, chunk, ctx, [&](std::int64_t done, std::int64_t) { bar.set(done); });
  }
  r.calib_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.calib_tokens = n;
  ProgressBar bar("mla conversion", model.hparams().n_layer, mode);
  r.report = convert_model_to_mla(model, cal, o.options(), ctx,
                                  [&](std::int64_t done, std::int64_t) { bar.set(done, "layers"); });
  model.set_mla_exec(parse_mla_exec(o.exec));
  return r;
}

void add_mla_columns(Row& row, const MlaCliOptions& o, const MlaCliResult& r) {
  row["mla_rank"] = o.rank;
  row["mla_freqfold"] = o.freqfold;
  row["mla_rope_heads"] = o.rope_heads;
  row["mla_latent"] = r.report.rank;
  row["mla_d_nope"] = r.report.d_nope;
  row["mla_d_rope"] = r.report.d_rope;
  row["calib_tokens"] = r.calib_tokens;
  row["calib_s"] = r.calib_s;
  row["convert_s"] = r.report.seconds;
}

}  // namespace numattn::cli
