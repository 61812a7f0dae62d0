// Shared pieces of the numattn subcommands: problem flags, timing, method rows.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "numattn/analysis/report.h"
#include "numattn/arch/hparams.h"
#include "numattn/attention/method.h"
#include "numattn/attention/random_problem.h"
#include "numattn/core/exec.h"
#include "numattn/core/file_io.h"
#include "numattn/core/timing.h"
#include "numattn/quant/qgemv.h"

namespace numattn::cli {

/// Problem flags shared by `run` and `bench`; in bench each is a comma-separated list.
struct ProblemFlags {
  std::string batch = "1", heads = "8", kv_heads = "0", n = "1024", n_kv = "0", d = "64",
              dv = "0", causal = "none", scale = "", seed = "0", dist = "gaussian",
              logit_scale = "1", layout = "bhnd", window_left = "-1", window_right = "-1";
  void add_to(CLI::App& app, bool lists);
  /// The product of all lists, as configs.
  std::vector<ProblemConfig> expand() const;
  /// Those of `flags` (e.g. "--n") that the user gave on the command line (after add_to).
  std::vector<std::string> given(const std::vector<std::string>& flags) const;
  /// Flags that describe random inputs (shapes, seed, distribution): refused with input files.
  static const std::vector<std::string>& input_flags();

 private:
  std::vector<CLI::Option*> options_;
};

/// Throws OptionError for the first of `flags` given on the command line, saying it conflicts
/// with `with` (e.g. "--qkv"): "--n cannot be combined with --qkv: the inputs fix it".
void refuse_flags(const ProblemFlags& pf, const std::vector<std::string>& flags, const std::string& with,
                  const std::string& why);

/// Median wall time of `fn` over `reps` runs after one warm-up, in milliseconds.
double time_median_ms(int reps, const std::function<void()>& fn);

/// How many reference rows to check: `requested` < 0 means "automatic" (all rows up to 4096,
/// else a seeded sample of 1024).
index_t rows_to_check(const AttentionProblem& p, long long requested);

/// Compares `k` seeded rows of `p.out` / `p.lse` with the float64 reference and fills `target`
/// (the method's target.h name) and the error columns (`target_rel_fro_error` against that
/// target, `rel_fro_error, max_abs_error, lse_max_abs_error, nmse` against softmax; null when
/// `k` is 0) and `rows_checked`. Returns the row's status: "ok", or "failed: ..." naming the
/// columns that are not finite numbers (written as null) and why.
std::string add_error_columns(Row& row, const AttentionProblem& p, const Target& target, index_t k,
                              std::uint64_t seed, const ExecContext& ctx);

/// The problem columns of a result row: method, batch, heads, kv_heads, n, n_kv, d, dv, causal,
/// seed (null for file inputs), source, threads.
Row problem_row(const AttentionMethod& method, const AttentionProblem& p, const ExecContext& ctx,
                const Row& seed, const std::string& source);

/// `source` of a random problem: "random <dist>".
std::string random_source(const ProblemConfig& c);

/// `--est-rows` and `--est-level` of run and bench: the a-posteriori error estimate
/// (analysis/estimate.h) of every row.
struct EstimateFlags {
  long long rows = -1;  ///< 0 = off, -1 = automatic (auto_estimate_rows)
  double level = 0.95;
  long long seed = -1;  ///< seed of the row design; -1 = derived from the problem's check seed
  void add_to(CLI::App& app);
};

/// Adds `est_rel_error`, `est_rel_error_hi`, `est_rows` and `est_level` to `row`: the estimate of
/// `p.out`'s error from `f.rows` rows drawn with `seed` (all null when `f.rows` is 0, or when the
/// output is not finite).
void add_estimate_columns(Row& row, const AttentionProblem& p, const EstimateFlags& f,
                          std::uint64_t seed, const ExecContext& ctx);

/// Runs `method` on `p` (timed, then checked on rows sampled with `check_seed`) and completes
/// `row` (problem_row) with time_ms, gflops, the error columns, workspace_bytes and status:
/// "ok", "skipped: <can_run's reason>" or "failed: <what run threw or the check found>"; with
/// `est.rows` > 0 also the estimate columns (add_estimate_columns, seed from `check_seed`).
Row run_method_row(const AttentionMethod& method, const AttentionProblem& p, Row row,
                   const ExecContext& ctx, int reps, long long check_rows, std::uint64_t check_seed,
                   const EstimateFlags& est = {0, 0.95});
/// The same on a random problem (source "random <dist>").
Row run_method_row(const AttentionMethod& method, RandomProblem& prob, const ExecContext& ctx,
                   int reps, long long check_rows, const EstimateFlags& est = {0, 0.95});

/// Refuses, before a model's weights are read, an attention spec list (as model/llama.h's
/// make_attention_methods: one spec, one per layer, or local:/global: selectors) with a method
/// that cannot run the model's attention problem: causal bottom-right, the model's query heads
/// over its KV heads (GQA), its head dimension, `n_q` query tokens over `n_kv` keys, and in a
/// local layer the model's sliding window. The check is the method's own `can_run` on such a
/// problem (zero-filled), so it covers every capability and limit a method declares. Throws
/// OptionError(`option`) naming the method, the layer and can_run's reason.
void check_model_attention(const std::string& option, const std::string& specs, const ModelHParams& hp,
                           index_t n_q, index_t n_kv, const std::string& what);

/// An output option of a command: its flag ("--out"), its value and what it names.
struct OutputOption {
  std::string flag;
  std::string path;
  OutputKind kind;
};

/// The one check of a command's output paths, before any work, of each output whose flag was
/// given on `app`'s command line (a required one always is): no output may be the same file as
/// an input or as another output (check_outputs_distinct, naming both), and each must be a
/// usable path of its kind (file_io.h's check_output_path: not empty, a file where a file is
/// expected, a directory where a directory is; errors are OptionError of the flag).
void check_output_options(const CLI::App& app,
                          const std::vector<OutputOption>& outputs,
                          const std::vector<NamedPath>& inputs);
/// check_output_path of one output whose flag is known to be given, as OptionError of `flag`.
void check_output_option(const std::string& flag, const std::string& path, OutputKind kind);

/// Adds `--threads` and `--format`.
void add_common(CLI::App& app, int* threads, std::string* format);

/// Splits a comma-separated list of plain values (sizes, layers, names without parameters);
/// empty items are dropped. Never for method specs: a spec's parameters hold commas
/// (split_spec_option).
std::vector<std::string> split_list(const std::string& s);

/// The specs of an option that takes several (`--ppl-methods`, `--bench-methods`, `--method`,
/// `--methods`): attention/registry.h's split_specs at `separators` outside parentheses, its
/// errors (empty list or item, unbalanced parentheses) as OptionError(`option`).
std::vector<std::string> split_spec_option(const std::string& option,
                                           const std::string& value,
                                           std::string_view separators = ",");
/// The same for a repeatable option: every value may itself be a list.
std::vector<std::string> split_spec_option(const std::string& option,
                                           const std::vector<std::string>& values,
                                           std::string_view separators = ",");

/// Adds `--activations` (f32 | q8: the activations of the products with in-place weights,
/// quant/qgemv.h); `list` accepts a comma-separated list (bench-model's interleaved forms).
void add_activations_option(CLI::App& app, std::string* activations, bool list = false);
/// Parses `--activations` (each entry of a list) against `--weights`: q8 with f32 weights is
/// refused (OptionError "activations"), before any model is loaded.
std::vector<Activations> check_activations_option(const std::string& activations,
                                                  const std::string& weights);

}  // namespace numattn::cli
