#include "mla_cli.h"

#include "numattn/core/error.h"

namespace numattn::cli {

void add_mla_options(CLI::App& sub, MlaCliOptions& o) {
  sub.add_option("--mla-rank", o.rank,
                 "deprecated alias of --transform \"mla(rank=...)\": convert the GQA attention to MLA at load (TransMLA) with latent "
                 "rank r for the NoPE keys and values; 0 = the full width (exact when --rope-heads "
                 "is the KV head count); -1 = no conversion")
      ->capture_default_str();
  sub.add_option("--mla-budget", o.budget,
                 "alias of --transform \"mla(budget=...)\": convert to MLA with a KV cache of this fraction of "
                 "the GQA cache, rank, RoPE dims and freqfold chosen on the calibration text")
      ->capture_default_str();
  sub.add_option("--freqfold", o.freqfold,
                 "deprecated (mla(freqfold=...)): with --mla-rank: M adjacent RoPE frequencies folded into one (must divide n_rot/2)")
      ->capture_default_str();
  sub.add_option("--rope-heads", o.rope_heads,
                 "deprecated (mla(rope_heads=...)): with --mla-rank: KV heads' worth of RoPE dims kept in the shared RoPE key (1..Hkv)")
      ->capture_default_str();
  sub.add_option("--calib", o.calib,
                 "deprecated (mla(calib=...)): with --mla-rank: calibration text ('default' = the default text; its last "
                 "--calib-tokens tokens are used, so `ppl --chunks N` from the start does not see "
                 "them)")
      ->capture_default_str();
  sub.add_option("--calib-tokens", o.calib_tokens, "deprecated (mla(calib_tokens=...)): with --mla-rank: calibration tokens")
      ->capture_default_str();
  sub.add_option("--mla-exec", o.exec,
                 "how the MLA layers of a numattn-mla file run (with --transform mla(...): its exec=): absorbed (W_uk on the query side, decode reads only the "
                 "latent cache) or naive (k_nope and v rebuilt from the cache)")
      ->capture_default_str()
      ->check(CLI::IsMember({"naive", "absorbed"}));
}

std::string mla_alias_spec(const CLI::App& sub, const MlaCliOptions& o) {
  if (sub.count("--mla-budget") > 0) {
    for (const char* f : {"--mla-rank", "--freqfold", "--rope-heads"})
      NUMATTN_CHECK_OPTION(sub.count(f) == 0, std::string(f + 2), "cannot be given with --mla-budget, which chooses it");
    return fmt::format("mla(budget={},calib={},calib_tokens={},exec={})", o.budget, o.calib, o.calib_tokens, o.exec);
  }
  if (o.rank == -1) {
    for (const char* f : {"--freqfold", "--rope-heads", "--calib", "--calib-tokens"})
      NUMATTN_CHECK_OPTION(sub.count(f) == 0, std::string(f + 2), "needs --mla-rank or --mla-budget");
    return "";
  }
  return fmt::format("mla(rank={},rope_heads={},freqfold={},calib={},calib_tokens={},exec={})", o.rank,
                     o.rope_heads, o.freqfold, o.calib, o.calib_tokens, o.exec);
}

void add_mla_columns(Row& row, const transform::MlaStage& s, const MlaStageResult& r) {
  row["mla_rank"] = r.report.options.rank;
  row["mla_freqfold"] = r.report.options.freqfold;
  row["mla_rope_dims"] = r.report.d_rope;
  row["mla_budget"] = s.budget;
  row["mla_balance"] = r.report.options.balance;
  row["mla_calib_mode"] = s.calib_mode;
  row["mla_latent"] = r.report.rank;
  row["mla_d_nope"] = r.report.d_nope;
  row["mla_d_rope"] = r.report.d_rope;
  row["calib_tokens"] = r.calib_tokens;
  row["calib_s"] = r.calib_s;
  row["convert_s"] = r.report.seconds;
}

}  // namespace numattn::cli
