#pragma once

#include <cstdint>
#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.clustered(clusters=100, topk=32, iters=10, seed=0)`: improved clustered attention
/// (Vyas, Katharopoulos, Fleuret, "Fast Transformers with Clustered Attention", NeurIPS 2020,
/// "i-clustered").
///
/// Per (batch, query head): the queries are clustered by k-means (decomp/kmeans.h, Euclidean,
/// k-means++ keyed by (seed, b·Hq + h); the paper clusters Hamming codes of an LSH, a cheaper
/// stand-in for the same k-means), C = min(clusters, Nq). For cluster c with centroid q̄_c:
///
///     A_c = softmax(s·q̄_c·Kᵀ)  (the centroid's attention over all keys)
///     T_c = the min(topk, Nk) keys with the largest A_c (ties: lower index)
///     m̂_c = Σ_{j∈T_c} A_c(j),   R_c = Σ_{j∉T_c} A_c(j)·v_j
///
/// and every query i of cluster c gets
///
///     out_i = m̂_c · softmax_{j∈T_c}(s·q_i·k_j)·V_{T_c} + R_c
///
/// i.e. its own exact attention on the centroid's top-k keys, carrying the centroid's mass on
/// them, plus the centroid's attention on the rest (a convex combination of values: the weights
/// sum to 1). m̂_c = 1 − Σ_{j∉T_c} A_c(j) in float64, so topk ≥ Nk gives m̂ = 1, R = 0: exact.
///
/// Non-causal only (a cluster's centroid mixes queries of all positions and its top-k would read
/// future keys): its kernel is non-causal; causal and sliding-window problems run by the causal recursion (AttentionMethod::causal_recursion, method.h).
/// Masks refused. No LSE (the output is not one softmax).
/// Cost per head: O(iters·Nq·C·Dk) k-means + O(C·Nk·(Dk+Dv)) centroid attention (sgemm) +
/// O(Nq·topk·(Dk+Dv)) per-query attention (sgemm per cluster). Memory O(C·Nk + Nq·Dk) per head.
class ClusteredAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// The clustering of query head (b, h) (for tests): centroids (C × Dk), assignment of each
  /// query, and each cluster's top-k key set T_c (ascending).
  struct Clustering {
    index_t clusters = 0;
    std::vector<float> centroids;
    std::vector<std::int32_t> assign;
    std::vector<std::vector<index_t>> topk;
  };
  Clustering clustering(const AttentionProblem& p, index_t b, index_t h) const;
};

}  // namespace numattn
