#pragma once

#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.smyrf(clusters=0, rounds=8, seed=0)`: SMYRF (Daras, Kitaev, Odena, Dimakis, NeurIPS
/// 2020). Balanced asymmetric-LSH clusters: each query
/// attends, exactly, to the keys of its cluster, in several independent rounds merged by their
/// softmax mass.
///
/// **Lift** (maximum inner product search → nearest neighbour). With the scale folded into the
/// queries (q' = s·q, so q'·k is the logit), M_Q = max ‖q'_i‖ and M_K = max ‖k_j‖ (norms, not
/// squared norms) and M² = M_Q² + M_K²:
///
///     F(q') = [q'; 0; sqrt(max(0, M² − ‖q'‖²))],   G(k) = [k; sqrt(max(0, M² − ‖k‖²)); 0]
///
/// so ‖F(q') − G(k)‖² = 2M² − 2 q'·k: the closest lifted key is the largest logit. Every lifted
/// vector has norm M; the fast path divides them all by M (a common positive factor leaves every
/// sorted order unchanged, and keeps float32 safe for any input magnitude). M_Q and M_K are
/// recomputed per call, per batch entry and KV head (M_Q over the query heads of a GQA group,
/// which share their kv head's key clusters). The square root is clamped at 0 (rounding makes its
/// argument negative for the longest vector).
///
/// **Clusters.** Per round r, one Gaussian direction w_r ∈ R^{Dk+2} (E2LSH's projection, drawn
/// from the counter RNG keyed by (seed, kv head), shared by the batch): the projections
/// w_r·F(q') of the queries and w_r·G(k) of the keys are sorted separately (stable) and cut into
/// L equal groups, queries into groups of ⌊Nq/L⌋ or ⌈Nq/L⌉, keys into groups of ⌊Nk/L⌋ or ⌈Nk/L⌉
/// (group g holds sorted positions [⌊g·N/L⌋, ⌊(g+1)·N/L⌋)); query group g attends to key group g
/// only. SMYRF's bin width r and offset b do not matter here: the balanced variant sorts the raw
/// projections. `clusters` = L; 0 (the default) means L = ⌈Nk/64⌉, the reference code's cluster
/// size of 64 keys (cost then linear in N). L is clamped to [1, min(Nq, Nk)].
///
/// **Rounds** (`rounds` = H, the reference code's default 8): per round the row's partial result
/// (o_r, l_r) = dense softmax over its cluster (l_r = log Σ exp(logit), with the
/// 1/sqrt(d) scale); the rounds are merged by softmax mass, o = Σ_r exp(l_r − logsumexp l)·o_r
/// (blocks/lse_merge.h). A key found in several rounds counts several times (SMYRF does not
/// correct for it, unlike Reformer's paper), so the merged log-sum-exp is not the row's LSE: no
/// LSE output. With L = 1 every round is the whole key set and one round is computed.
///
/// Limit case: clusters = 1 is exact softmax attention (any rounds). Error: the softmax mass of
/// keys outside every round's cluster (renormalised away) plus the double counting of keys seen
/// in several rounds. Its kernel is non-causal (balanced clusters mix past and future keys; the
/// reference implementation has no causal mode); causal and sliding-window problems run by the causal recursion (AttentionMethod::causal_recursion, method.h). No masks; GQA and batches; Dk ≠ Dv.
///
/// Measured (relative Frobenius error against exact softmax; N = 4096, D = 64, 2 heads): Gaussian
/// inputs 2.76 / 1.36 / 0.61 at L = 64 (default) / 16 / 4, 5.39 / 2.76 / 1.41 at H = 2 / 8 / 32;
/// spiky inputs 2.27 / 1.21 / 0.48. Flat rows err most (their exact output is a small average of
/// many values). Top-8 recall at L = 16 over 256 keys: 0.54 with H = 8 on Gaussian inputs (random
/// clusters: 0.40), 0.97 on clustered inputs. Speed at N = 16384, D = 64, 4 heads, 2 threads:
/// 6.4× exact.flash (same run).
///
/// Cost per head: projections O(N·Dk·H), sorts O(H·N log N), attention
/// O(H·Nq·(Nk/L)·(Dk+Dv)) through the flash kernel (blocks/dense_softmax.h) on each gathered
/// (query group, key group) pair. Memory: O(H·(Nq + Nk)) orders per head, O(N·(Dk+2)) lifted
/// rows and O((Nq + Nk)/L·(Dk+Dv)) gathered rows per thread.
class SmyrfAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// L on `p` (see above) and the number of rounds computed (1 when L = 1).
  index_t clusters_for(const AttentionProblem& p) const;
  index_t rounds_for(const AttentionProblem& p) const;

  /// (Dk+2) × rounds_for(p) row-major: column r is round r's direction for KV head `hk`.
  std::vector<float> directions(index_t d_lifted, index_t rounds, index_t hk) const;

  /// The clusters of round r for query head (b, h): the cluster of every query row and of every
  /// key of its kv head (the fast path's own assignment, for tests).
  struct Round {
    std::vector<index_t> query_cluster, key_cluster;
  };
  std::vector<Round> assignment(const AttentionProblem& p, index_t b, index_t h) const;

  /// The lift in float64, unnormalised: out = F(q) or G(k), Dk + 2 entries, with norms (not
  /// squared norms) mq = M_Q and mk = M_K.
  static void lift_query(const double* q, index_t d, double mq, double mk, double* out);
  static void lift_key(const double* k, index_t d, double mq, double mk, double* out);
};

}  // namespace numattn
