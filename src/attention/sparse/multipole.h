#pragma once

#include <cstdint>
#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.multipole(clusters=0, near=8, iters=10, seed=0)`: Multipole Attention (Hooper, Zhao,
/// Manolache, Kim, Mahoney, Shao, Keutzer, Gholami, NeurIPS 2025), one level (no hierarchy).
///
/// Per (batch, kv head): k-means on the keys (decomp/kmeans.h, Euclidean, k-means++ keyed by
/// (seed, b·Hkv + hk)), C = `clusters` (0: ceil(sqrt(Nk))), clamped to Nk. Cluster i has N_i
/// keys, key centroid Kc_i and value centroid Vc_i (means, accumulated in float64). Per query
/// row q (of each query head: the importance is per query head, not aggregated over the GQA
/// group, which is at least as accurate and costs the same here):
///
///     importance u_i = s·q·Kc_i + log N_i   (S_i ∝ N_i·exp(s·q·Kc_i); the normaliser of S sums
///                                             over all clusters, j = i included)
///     E = the keys of the `near` clusters of largest u_i (a count of clusters, not a token
///         budget; ties: lower cluster index), F = the other clusters
///     out = [Σ_{j∈E} e^{s·q·k_j} v_j + Σ_{i∈F} N_i e^{s·q·Kc_i} Vc_i] / [Σ_{j∈E} e^{s·q·k_j} + Σ_{i∈F} N_i e^{s·q·Kc_i}]
///
/// computed as log-sum-exp merges of per-cluster exact partials and one far-field partial (the
/// far clusters are pseudo-keys with logits u_i and values Vc_i), so nothing overflows; the LSE
/// output is the log of that denominator. Limits: near ≥ C (every cluster exact) is exact
/// softmax; C = Nk (each key its own centroid) makes the monopole terms exact too.
///
/// Causal (both alignments), the paper's blockwise clustering made exact about the past: the
/// keys are cut into segments of S = 4·ceil(Nk/C) keys (about four clusters each), each segment
/// clustered on its own keys only (C_s = ceil(C·S/Nk) clusters). A row whose diagonal key
/// e = min(i + off, Nk − 1) lies in segment t attends exactly to keys t·S..e of its own segment
/// and chooses near/far among the clusters of segments 0..t−1 only: no key after e is read, and
/// no cluster it uses contains one (rows before the first full segment are exact). A row with
/// no visible key gives 0 and LSE −inf. Non-causal: one segment of all keys, no local part.
/// Masks and windows refused.
/// Cost per head: O(iters·Nk·C·Dk) k-means per kv head + O(Nq·C·(Dk+Dv)) importance and far field
/// (sgemm) + O(Nq·near·(Nk/C)·(Dk+Dv)) exact near field (+ O(Nq·S·(Dk+Dv)) causal local part) (sgemm per cluster per block of 1024
/// queries). Memory O(Nk·(Dk+Dv) + C·(Dk+Dv)) per kv head, O(1024·(C + Nk/C + Dv)) per thread.
class MultipoleAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// The key clustering of kv head (b, hk) (for tests): C, the cluster of each key.
  struct KeyClusters {
    index_t clusters = 0;
    std::vector<std::int32_t> assign;
  };
  KeyClusters key_clusters(const AttentionProblem& p, index_t b, index_t hk) const;
  /// C for this problem.
  index_t clusters_for(const AttentionProblem& p) const { return clusters_of(params(), p); }
  static index_t clusters_of(const ParamValues& params, const AttentionProblem& p);
};

}  // namespace numattn
