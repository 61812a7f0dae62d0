// The MLA flags of `numattn ppl`, `bench-model` and `convert` (GQA → MLA at load,
// model/mla_convert.h): aliases of the `mla` transform (transform/pipeline.h), and its columns.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "numattn/model/transform_model.h"

namespace numattn::cli {

struct MlaCliOptions {
  std::int64_t rank = -1;  ///< -1: no conversion (unless budget)
  double budget = 0;       ///< > 0: mla(budget=...)
  int freqfold = 1, rope_heads = 1;
  std::string calib = "default", exec = "absorbed";
  std::int64_t calib_tokens = 2048;
  bool requested() const { return rank >= 0 || budget > 0; }
};

/// Adds --mla-rank, --mla-budget, --freqfold, --rope-heads, --calib, --calib-tokens (deprecated aliases of
/// --transform "mla(...)") and --mla-exec (how the MLA layers of a numattn-mla file run; with
/// --mla-rank, the exec= of the stage) to `sub`.
void add_mla_options(CLI::App& sub, MlaCliOptions& o);

/// The `mla(...)` stage the aliases stand for ("" without --mla-rank or --mla-budget; the other
/// MLA flags without one of them are refused, naming the flag). The values are checked by the
/// pipeline.
std::string mla_alias_spec(const CLI::App& sub, const MlaCliOptions& o);

/// The conversion's columns: mla_rank, mla_freqfold, mla_rope_dims (what was converted: the
/// budget's choice when there is one), mla_budget, mla_calib_mode, mla_latent (r), mla_d_nope,
/// mla_d_rope, calib_tokens, calib_s, convert_s.
void add_mla_columns(Row& row, const transform::MlaStage& s, const MlaStageResult& r);

}  // namespace numattn::cli
