/// @file context_parallel.h
/// Exact attention with the sequence split across the ranks of a communicator (comm.h):
/// ring attention and all-to-all head parallelism (Ulysses).
///
/// Sharding. Query rows and key/value rows are split across R ranks by a `Partition`:
/// - contiguous: rank r holds rows [r·n/R, (r+1)·n/R) (sizes differ by at most one);
/// - zigzag: the rows are cut into 2R chunks and rank r holds chunks r and 2R−1−r, so that
///   under a causal mask every rank has one early and one late chunk and the same work
///   (Brandon et al., Striped Attention, 2023; the zig-zag order of Llama 3 context parallelism).
/// A rank's local tensors hold its rows in increasing global order, its segments concatenated.
///
/// Ring attention (`ring_attention`; Liu et al., Ring Attention with Blockwise Transformers,
/// ICLR 2024): K/V shards travel around the ring r → r+1 for R steps, one KV head at a time; at
/// each step a rank posts MPI_Isend of the block it holds and MPI_Irecv of the next one, then
/// computes its query rows against the block it holds with the local `exact.flash` kernel
/// (blocks/dense_softmax.h) and merges the partial (out, lse) into its result exactly through
/// log-sum-exp (blocks/lse_merge.h), in the fixed step order. Causal rule, window and masks are
/// global: each (query segment, key segment) pair is a sub-problem whose diagonal sits at an
/// arbitrary offset, which is handed to the kernel as a window about its own diagonal after
/// dropping rows that see no key of the block and keys no row sees, so only the visible part is
/// computed and no pair needs a mask. Each rank's K/V rows travel in pieces of at most 8192
/// rows (one ring of R steps per KV head and piece), which bounds the message buffers. Cost per
/// rank: the rank's share of the attention flops (equal shares with zigzag + causal) plus
/// (R−1)·B·Hkv·(Nk/R)·(Dk+Dv)·4 bytes sent; memory beyond the shard: two buffers of one piece
/// of one KV head (one when R = 1) plus one query segment's partial output of one GQA group.
///
/// Ulysses (`ulysses_attention`; Jacobs et al., DeepSpeed Ulysses, 2023): one all-to-all turns
/// the sequence-sharded q, k, v into head-sharded full sequences (rank r gets KV heads
/// [r·Hkv/R, (r+1)·Hkv/R) and their query heads), `exact.flash` runs locally on the whole
/// sequence, and a second all-to-all returns out and lse to the sequence shards. Needs
/// Hkv % R == 0. Cost per rank: the attention flops of Hq/R heads (balanced under any mask),
/// (R−1)/R of the shard of q, k, v, out, lse sent; not overlapped with compute.
///
/// Both are collective: every rank of `comm` calls them with shards of the same global
/// problem, from the thread that initialised MPI. Results: rows of `out` (and `lse`) in the
/// rank's shard; equal to `exact.flash` on the whole problem within float32 rounding
/// (docs/distributed.md: the partial merges add one rounding of the LSE per step).
/// Edges: a non-finite value or a float32 overflow reaches the rows it touches as NaN/inf
/// (no float64 fallback runs on shards); `check_shard_finite` refuses such inputs up front.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numattn/attention/problem.h"
#include "numattn/attention/random_problem.h"
#include "numattn/core/exec.h"
#include "numattn/dist/comm.h"

namespace numattn::dist {

enum class Partition { kContiguous, kZigzag };
/// "contiguous" | "zigzag"; throws Error otherwise.
Partition parse_partition(const std::string& s);
const char* to_string(Partition p);

/// Half-open range of global rows.
struct Segment {
  index_t begin = 0, end = 0;
  index_t size() const { return end - begin; }
};

/// The global rows rank `rank` of `ranks` holds, in increasing order (empty segments dropped).
std::vector<Segment> shard_segments(index_t n, int ranks, int rank, Partition part);
/// Total rows of `segs`.
index_t rows_of(const std::vector<Segment>& segs);

/// A rank's part of a sequence-parallel problem. `local` holds the shard: q, out, lse with the
/// rank's query rows (`q_rows`), k and v with its key rows (`kv_rows`), each in global order;
/// `local.scale`, `causal`, `window_*` and `mask` are those of the global problem (the mask is
/// the global [Nq, Nk] one: every rank reads its own rows of it). q, k, v may have any strides
/// with a contiguous last dimension.
struct ShardedProblem {
  AttentionProblem local;
  index_t n_q = 0, n_kv = 0;       ///< global sequence lengths
  Partition partition = Partition::kZigzag;
  std::vector<Segment> q_rows, kv_rows;

  /// A problem with only the global shapes and semantics (data pointers null): `visible`,
  /// `key_range`, `diag_offset` and `attention_flops` answer for the global problem.
  AttentionProblem global_shape() const;
  /// Throws Error naming the rank's tensor and the expected shape when `local` does not fit
  /// the partition of (n_q, n_kv) for `rank` of `ranks`.
  void validate(int rank, int ranks) const;
};

/// Timing of one distributed call on this rank.
struct DistStats {
  double total_s = 0;      ///< wall time of the call
  double wait_s = 0;       ///< blocked in MPI_Wait / collectives
  double bytes_sent = 0;   ///< payload this rank sent
  int steps = 0;           ///< ring steps or all-to-all rounds
};

/// Ring attention (see the file comment). Collective. `piece_rows`: the most K/V rows of one
/// rank that travel in one message (the buffers' size); results do not depend on it beyond
/// rounding (the merge order follows the pieces).
void ring_attention(Comm& comm, const ShardedProblem& sp, const ExecContext& ctx, DistStats* stats = nullptr,
                    index_t piece_rows = 8192);
/// Ulysses head parallelism (see the file comment). Collective. Throws Error (on every rank
/// alike, before communicating) when Hkv % ranks != 0 or the partition is not contiguous.
void ulysses_attention(Comm& comm, const ShardedProblem& sp, const ExecContext& ctx, DistStats* stats = nullptr);
/// Whether Ulysses can run `sp` on `ranks` ranks, and why not.
Status ulysses_can_run(const AttentionProblem& global, int ranks);

/// Throws `NonFiniteInput` (global indices) for the first NaN/±inf of the shard's q, k or v:
/// distributed runs refuse any non-finite input element of a shard, read or not.
void check_shard_finite(const ShardedProblem& sp);

/// Owns a rank's shard of the random problem `cfg` (random_problem.h): the same values as
/// RandomProblem(cfg) at the same global indices, generated locally, in BHND layout.
class RandomShard {
 public:
  RandomShard(const ProblemConfig& cfg, int rank, int ranks, Partition part);
  RandomShard(const RandomShard&) = delete;
  RandomShard& operator=(const RandomShard&) = delete;
  const ShardedProblem& sharded() const { return sp_; }
  ShardedProblem& sharded() { return sp_; }
  std::size_t bytes() const;

 private:
  std::vector<float> q_, k_, v_, out_, lse_;
  ShardedProblem sp_;
};

/// Float64 check of a sharded result: every rank checks `count` rows sampled with `seed` from
/// the global rows (those in its own shard), computing the reference in float64 as the K/V
/// shards pass around the ring once more. Returns the global metrics on every rank.
struct DistCheck {
  index_t rows_checked = 0;
  double rel_fro_error = 0, max_abs_error = 0, lse_max_abs_error = 0, nmse = 0;
  double logit_magnitude = 0;  ///< L of the checked rows (accuracy.h); bounds use it
  bool finite = true;
  bool passed = false;         ///< within exact_f32_tolerance(L) (accuracy.h)
};
DistCheck check_sharded(Comm& comm, const ShardedProblem& sp, index_t count, std::uint64_t seed,
                        const ExecContext& ctx);

}  // namespace numattn::dist
