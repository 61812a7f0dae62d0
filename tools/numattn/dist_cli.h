// `numattn run|bench` under mpirun: each rank generates or reads only its shard, runs a dist.*
// method collectively, and rank 0 prints the row (docs/distributed.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "numattn/analysis/report.h"
#include "numattn/attention/method.h"
#include "numattn/attention/random_problem.h"
#include "numattn/core/exec.h"

namespace numattn::cli {

/// Whether `run`/`bench` take the distributed path: the process was started by an MPI launcher
/// (mpirun -n R, R ≥ 1). Methods of other families are then refused by `check_dist_method`.
bool distributed_launch();
/// Throws OptionError("method") unless `m` is a dist.* method.
void check_dist_method(const AttentionMethod& m);
/// This rank's number (0 outside MPI): only rank 0 prints.
int dist_rank();

/// Inputs read from .npy files ([N,D], [H,N,D] or [B,H,N,D]; [B,N,H,D] with bnhd), each rank
/// reading only its rows (by offset), with the run's semantics flags.
struct DistFiles {
  std::string q, k, v;
  Layout layout = Layout::kBHND;
  double logit_scale = 1.0;
  Causal causal = Causal::kNone;
  std::optional<double> scale;
  index_t window_left = -1, window_right = -1;
};

/// One distributed problem (random `cfg`, or `files` when not null; `cfg.want_lse` applies to
/// both) with method `m`; collective.
/// Returns the row on every rank (the same values): the `run` columns, with the float64 check
/// of `check_rows` sampled rows (-1: all up to 4096, else 1024), plus ranks, partition,
/// wait_ms, wait_fraction (the largest over ranks of time blocked on messages / total),
/// bytes_sent_per_rank, shard_bytes and peak_rss_bytes (largest over ranks). `out`/`lse_out`:
/// gathered on rank 0 and written there (BHND .npy).
Row run_distributed(const AttentionMethod& m, const ProblemConfig& cfg, const DistFiles* files,
                    const ExecContext& ctx, int reps, long long check_rows, const std::string& out,
                    const std::string& lse_out);

}  // namespace numattn::cli
