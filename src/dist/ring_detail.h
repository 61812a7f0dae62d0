// Private to src/dist: the K/V ring, and one (query segment, key segment) pair of a sharded
// problem as a sub-problem of the local exact.flash kernel.
#pragma once

#include <functional>
#include <vector>

#include "numattn/dist/context_parallel.h"

namespace numattn::dist {

/// How a pair is computed. The global rule i + off − L ≤ j ≤ i + off + U (causal: U = 0) puts
/// the pair's visible band about a diagonal at an arbitrary offset c0 = qs.begin + off −
/// ks.begin; the kernel's window is about its own diagonal (offset 0 without causal), so the
/// pair drops its first `a` rows (they see none of its keys) and first `b` keys (no kept row
/// sees them), after which the band is the window [window_left, window_right] about the
/// kernel's diagonal, both ≥ 0 when bounded (−1 = unbounded).
struct PairPlan {
  bool run = false;  ///< false: no row of the segment sees a key of the block
  index_t a = 0, b = 0;
  index_t window_left = -1, window_right = -1;
};

/// The plan for query rows `qs` against key rows `ks` of the global problem `g`
/// (ShardedProblem::global_shape). Masks are not looked at (they only hide more).
PairPlan plan_pair(const AttentionProblem& g, Segment qs, Segment ks);

/// Runs the pair: `q` [B, G, qs.size(), Dk] (query heads of one KV head), `k`, `v` [B, 1,
/// ks.size(), D], into `out` [B, G, qs.size(), Dv] and `lse`; rows below `pl.a` are not written.
void attend_pair(const AttentionProblem& g, const PairPlan& pl, Segment qs, Segment ks,
                 TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                 TensorView<float> out, TensorView<float> lse, const ExecContext& ctx);

/// The K/V ring of a sharded problem: for one KV head and one piece, every rank's block visits
/// every rank, one step each, own block first. A rank's key rows are cut into `pieces()` pieces
/// of about `max_rows` rows (piece j = the j-th part of each of its segments, which keeps the
/// steps balanced under zigzag), so that the two buffers (one when R = 1) hold one piece of one
/// KV head: the block being computed on is sent on while the next one is received.
class KvRing {
 public:
  KvRing(Comm& comm, const ShardedProblem& sp, index_t max_rows = 8192);
  int pieces() const { return pieces_; }
  /// Block of rank `src`: its key segments, k [B, 1, nk, Dk] and v [B, 1, nk, Dv].
  using Visit = std::function<void(int src, const std::vector<Segment>& segs, TensorView<const float> k,
                                   TensorView<const float> v)>;
  /// Runs the R steps of piece `piece` of KV head `hk`; `visit` runs while the next block is in
  /// flight. Adds the time blocked in MPI_Wait and the bytes sent to `st`.
  void rotate(index_t hk, int piece, const Visit& visit, DistStats& st);

 private:
  struct Block {
    std::vector<float> buf;
    index_t nk = 0;
  };
  Comm& comm_;
  const ShardedProblem& sp_;
  /// Global key segments of piece `piece` of rank `r`'s rows.
  std::vector<Segment> piece_segments(int r, int piece) const;
  std::vector<std::vector<Segment>> segs_;  ///< every rank's key segments
  int pieces_ = 1;
  Block cur_, nxt_;
};

}  // namespace numattn::dist
