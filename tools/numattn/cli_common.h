// Shared pieces of the numattn subcommands: problem flags, timing, method rows.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "numattn/analysis/report.h"
#include "numattn/attention/method.h"
#include "numattn/attention/random_problem.h"
#include "numattn/core/exec.h"

namespace numattn::cli {

/// Problem flags shared by `run` and `bench`; in bench each is a comma-separated list.
struct ProblemFlags {
  std::string batch = "1", heads = "8", kv_heads = "0", n = "1024", n_kv = "0", d = "64",
              dv = "0", causal = "none", scale = "", seed = "0", dist = "gaussian",
              logit_scale = "1", layout = "bhnd", window_left = "-1", window_right = "-1";
  void add_to(CLI::App& app, bool lists);
  /// The product of all lists, as configs.
  std::vector<ProblemConfig> expand() const;
};

/// Median of `v` (mean of the two middle values for an even count); `v` must not be empty.
double median(std::vector<double> v);

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

/// Runs `method` on the problem `cfg` (timed, then checked) and returns the result row; its
/// status is "ok", "skipped: <can_run's reason>" or "failed: <what run threw or the check found>".
Row run_method_row(const AttentionMethod& method, RandomProblem& prob, const ExecContext& ctx,
                   int reps, long long check_rows);

/// Adds `--threads` and `--format`.
void add_common(CLI::App& app, int* threads, std::string* format);

std::vector<std::string> split_list(const std::string& s);

}  // namespace numattn::cli
