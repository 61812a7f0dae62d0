// The MLA flags shared by `numattn ppl` and `numattn convert` (GQA → MLA at load,
// model/mla_convert.h), and the conversion they run.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "numattn/core/exec.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_convert.h"
#include "numattn/model/tokenizer.h"

namespace numattn::cli {

/// Tokens per calibration chunk (each from an empty cache), the same for ppl, convert and
/// bench-model so that they convert a model identically.
inline constexpr std::int64_t kMlaCalibChunk = 512;

struct MlaCliOptions {
  std::int64_t rank = -1;  ///< -1: no conversion
  int freqfold = 1, rope_heads = 1;
  std::string calib = "default", exec = "absorbed";
  std::int64_t calib_tokens = 2048;
  bool requested() const { return rank >= 0; }
  transform::MlaOptions options() const;
};

/// Adds --mla-rank, --freqfold, --rope-heads, --calib, --calib-tokens, --mla-exec to `sub`.
void add_mla_options(CLI::App& sub, MlaCliOptions& o);
/// Checks the flags before anything is loaded (OptionError naming the flag).
void check_mla_options(const CLI::App& sub, const MlaCliOptions& o);

/// Checks the flags against the model's header (before its weights are read): --rope-heads
/// at most head_count_kv, --freqfold dividing n_rot/2, and no --mla-rank on an MLA file.
void check_mla_against_model(const MlaCliOptions& o, const ModelHParams& hp, bool file_is_mla);

struct MlaCliResult {
  MlaModelReport report;
  std::int64_t calib_tokens = 0;
  double calib_s = 0;
};

/// Calibrates `model` (GQA) on the last --calib-tokens tokens of the --calib text, in chunks of
/// `chunk` tokens, then converts it in place; progress on stderr when it is a terminal.
MlaCliResult convert_for_cli(LlamaModel& model, const Tokenizer& tok, const MlaCliOptions& o,
                             std::int64_t chunk, const ExecContext& ctx, bool progress);

/// The conversion's columns: mla_rank, mla_freqfold, mla_rope_heads, mla_latent (r), mla_d_nope,
/// mla_d_rope, calib_tokens, calib_s, convert_s.
void add_mla_columns(Row& row, const MlaCliOptions& o, const MlaCliResult& r);

}  // namespace numattn::cli
