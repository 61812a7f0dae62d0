#pragma once

#include <cstdint>
#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.routing(clusters=0, iters=4, seed=0)`: Routing Transformer attention (Roy, Saffar,
/// Vaswani, Grangier, TACL 2021), training-free.
///
/// Per (batch, query head h, its kv head): the rows of Q_h and K are L2-normalised and clustered
/// together by spherical k-means (decomp/kmeans.h: k-means++ from the counter RNG keyed by
/// (seed, b·Hq + h), then `iters` Lloyd iterations on the current Q ∪ K; the paper learns these
/// shared centroids during training). C = `clusters` (0: ceil(sqrt(Nk)), the paper's k ≈ √N),
/// clamped to Nq + Nk. Each cluster c takes its w_q = ceil(Nq/C) queries and w_k = ceil(Nk/C)
/// keys with the largest cosine to μ_c (balanced top-w routing: a token can be in several
/// clusters or in none). Query i then attends, by exact softmax, to the union P_i of the keys
/// of the clusters it belongs to; keys outside P_i are masked (−∞, not 0: never weight e^0).
/// A key shared by two of i's clusters is counted once (it is masked in the later cluster), so
/// the per-cluster partial results have disjoint supports and their log-sum-exp merge is exactly
/// softmax over P_i; the LSE output is that of P_i.
///
/// **Queries in no cluster** (top-w routing drops them; the paper covers them with local heads)
/// join the cluster of their nearest centroid, so every row has an output.
///
/// Non-causal only: with data-dependent centroids (training-free), the routing of a past query
/// would depend on future keys; causal routing needs centroids fitted without them (learned or
/// calibrated offline), which this method does not have. Its kernel is therefore non-causal;
/// causal and sliding-window problems run by the causal recursion (AttentionMethod::causal_recursion, method.h). Masks: refused.
///
/// Cost per head: O(iters·(Nq+Nk)·C·Dk) for k-means (GEMM-shaped), O(C·w_q·w_k·(Dk+Dv)) =
/// O(Nq·Nk·(Dk+Dv)/C) for the cluster attention (sgemm per cluster, tiled over queries).
/// Memory: O((Nq+Nk)·(Dk + C) + Nq·Dv) per head in flight. Limit: clusters = 1 is exact.
class RoutingAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// The routing of query head (b, h) (for tests): C, and for each cluster its member queries
  /// and keys, ascending, after the orphan rule above.
  struct Routing {
    index_t clusters = 0;
    std::vector<std::vector<index_t>> queries, keys;
  };
  Routing routing(const AttentionProblem& p, index_t b, index_t h) const;
  /// C for this problem.
  index_t clusters_for(const AttentionProblem& p) const { return clusters_of(params(), p); }
  static index_t clusters_of(const ParamValues& params, const AttentionProblem& p);
};

}  // namespace numattn
