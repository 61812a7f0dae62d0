/// @file ppl.h
/// Distributed perplexity: `evaluate_perplexity` (model/ppl.h) with the chunks split across the
/// ranks of a communicator.
///
/// Chunk c runs on rank c mod R (round robin: ranks get equal counts ±1, and early and late
/// text alike). Each rank evaluates its chunks exactly as the single process would (same model,
/// same attention, same thread count → the same per-token values), rank 0 gathers the
/// per-token vectors (NLL, and with a baseline KL, baseline NLL, top-1 agreement) in chunk
/// order and computes the statistics with `summarize_perplexity`, the single-process code: PPL,
/// its standard error, KL mean and 99th percentile and top-1 agreement are bitwise those of
/// one process. `seconds` is the slowest rank's forward time and `tokens_processed` the sum,
/// so `tokens_per_s` is the job's throughput; `profile` is rank 0's.
/// Cost: the chunks' forward passes / R per rank, one gather of 8·(3 + 1)·tokens_scored bytes.
/// Collective; the attention must not itself communicate (dist.* methods are refused: each
/// rank runs different chunks).
#pragma once

#include "numattn/dist/comm.h"
#include "numattn/model/ppl.h"

namespace numattn::dist {

/// On rank 0 the full result (per-token vectors included); on other ranks the statistics too
/// (broadcast), without the per-token vectors.
PplResult evaluate_perplexity(Comm& comm, const LlamaModel& model, const std::vector<std::int32_t>& tokens,
                              std::int32_t bos_id, bool add_bos, const PplOptions& opt, const ExecContext& ctx);

}  // namespace numattn::dist
