#pragma once

#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.kdeformer(samples=800, bits=7, bucket=128, seed=0)`: KDEformer's practical algorithm
/// (Zandieh, Han, Daliri, Karbasi, ICML 2023, Algorithm 3 / the official `KDEformer.py`).
/// Y ≈ Z̃⁻¹ (A_spar + A_res Sᵀ S) V: an LSH block-diagonal part computed exactly plus the residual
/// estimated by importance-sampled keys.
///
/// **Blocks.** Queries and keys are hashed by SimHash with `bits` Gaussian directions (drawn from
/// the counter RNG keyed by (seed, kv head); the sign of the scale is applied to the queries),
/// codes ordered by their Gray-code rank (buckets next to each other differ in one bit), stably
/// sorted, and cut into nb = ⌈Nk/bucket⌉ aligned blocks: block g holds sorted keys
/// [⌊g·Nk/nb⌋, ⌊(g+1)·Nk/nb⌋) (at most `bucket` keys) and sorted queries [⌊g·Nq/nb⌋,
/// ⌊(g+1)·Nq/nb⌋). A query sees every key of its block exactly.
///
/// **Residual.** m = `samples` key indices are drawn with replacement (once per batch entry and
/// KV head, shared by its queries) from
///
///     p_j ∝ ‖v̄_j‖ / λ_max(V̄ᵀV̄) + 1/Nk,   V̄ = [V | 1]
///
/// (the official code's distribution: an unsquared norm over an eigenvalue, not ‖v_j‖²/‖V‖²_op;
/// λ_max by power iteration on the (Dv+1)² Gram matrix). Each draw t has weight 1/(m·p_{j_t});
/// draws of the same key are summed into one weight; a drawn key that lies in the query's own block
/// is dropped (it is already counted exactly). Why this distribution and not the paper's: the paper
/// samples by the (estimated) squared column norms of Z⁻¹A (c_j = Σ_i z_i⁻² exp(2 s q_i·k_j)),
/// which needs a KDE estimate of every normaliser z_i and then a second KDE over all queries per
/// key — two more passes of the method's own cost per call; the official distribution costs
/// O(Nk·Dv), is shared by all queries, and is what the published experiments ran. Its 1/Nk term
/// keeps every p_j ≥ 1/(Nk·(1 + Σ‖v̄‖/λ)), so the weights stay bounded.
///
/// **Output**, per query row i with its block B(i) and the kept draws T(i):
///
///     num_i = Σ_{j∈B(i)} e^{ℓ_ij} v_j + Σ_{j∈T(i)} w_j e^{ℓ_ij} v_j,  den_i the same sums without v_j
///     out_i = num_i / den_i,   lse_i = log den_i
///
/// with ℓ_ij = scale·q_i·k_j (the official code's [V | 1] product: its last column is den).
/// Overflow safety (the official code exponentiates raw logits): both sums are carried as
/// (normalised output, log-sum-exp) pairs, the residual's with log w_j added to its logits, and
/// merged by log-sum-exp (blocks/lse_merge.h), i.e. a per-row shift carried through numerator and
/// denominator. Each sum is an unbiased estimate of its exact counterpart (given the hashes);
/// their **ratio is biased** (E[num/den] ≠ E[num]/E[den]), the bias shrinking like 1/m. lse_i is
/// the log of the estimated normaliser: the LSE of the weights that define out_i.
///
/// Limit case: bucket ≥ Nk (one block holds every key: every draw is dropped) is exact. The
/// error falls as `samples` grows (Monte Carlo, about 1/sqrt(m) for the residual).
/// Its kernel is non-causal (the paper has none); causal and sliding-window problems run by the causal recursion (AttentionMethod::causal_recursion, method.h). No masks; GQA (a group's query heads share their kv head's
/// hashes and draws), batches, Dk ≠ Dv.
///
/// Measured (relative Frobenius error against exact softmax; N = 4096, D = 64, 2 heads): Gaussian
/// inputs 6.25 / 2.21 / 0.95 at m = 100 / 800 / 4000, spiky inputs 4.14 / 2.01 / 0.88 (flat rows
/// err most: about sqrt(Nk/m) from the draws). Top-8 recall of the LSH block (8 blocks of 32
/// keys): about 0.2 against 0.125 for a random block. Speed at N = 16384, D = 64, 4 heads, 2
/// threads: 10.9× exact.flash (same run).
///
/// Cost per head: hashing O(N·Dk·bits), sorts O(N + 2^bits), blocks O(Nq·(Nk/nb)·(Dk+Dv)),
/// residual O(Nq·min(m, Nk)·(Dk+Dv)), both through the flash kernel (blocks/dense_softmax.h);
/// the distribution O(Nk·Dv²). Memory: O(N) orders per head, O(m·(Dk+Dv)) sampled rows per kv
/// head, O((Nq/nb)·(min(m, Nk) + Dk + Dv)) per thread.
class KdeformerAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// nb on `p`.
  index_t blocks_for(const AttentionProblem& p) const;

  /// What one (batch, kv head) shares: the key order and blocks, and the draws.
  struct KeyPlan {
    std::vector<index_t> order;   ///< sorted position → key
    std::vector<index_t> block;   ///< key → its block
    std::vector<index_t> sample;  ///< distinct drawn keys, ascending
    std::vector<double> weight;   ///< their summed weights (count / (m·p_j))
  };
  KeyPlan key_plan(const AttentionProblem& p, index_t b, index_t hk) const;
  /// Sorted position → query row, for query head (b, h).
  std::vector<index_t> query_order(const AttentionProblem& p, index_t b, index_t h) const;
  /// The sampling distribution p_j of (b, hk) (normalised; every key, for tests).
  static std::vector<double> sampling_probabilities(const AttentionProblem& p, index_t b, index_t hk);

  /// The exponential KDE identity behind KDEformer's theory, in float64, for tests and analysis.
  /// κ(q, K, x) = Σ_i x_i exp(⟨q, k_i⟩) (x ≥ 0) equals exp(‖q‖²/2)·C·N·μ(q̃) with the lift
  /// q̃ = [q; 0], k̃_i = [k_i; y_i], C = Σ_j x_j exp(‖k_j‖²/2), y_i ≥ 0 solving
  /// x_i exp(‖k_i‖²/2) exp(y_i²/2) = C, and the Gaussian KDE μ(q̃) = (1/N) Σ_i exp(−‖q̃ − k̃_i‖²/2).
  /// (The survey of Serret et al., arXiv 2604.01757, 2026, drops exp(‖q‖²/2) and writes
  /// exp(‖k_i‖²) in the y-equation.) K is n × d row-major.
  struct KdeLift {
    double log_c = 0;        ///< log C
    std::vector<double> y;   ///< y_i (+inf for x_i = 0: that key contributes nothing)
  };
  static KdeLift kde_lift(const double* k, index_t n, index_t d, const double* x);
  /// Σ_i x_i exp(⟨q, k_i⟩), directly.
  static double exp_kde(const double* q, const double* k, index_t n, index_t d, const double* x);
  /// μ(q̃) of the lift.
  static double gaussian_kde(const double* q, const double* k, index_t n, index_t d, const KdeLift& lift);
  /// exp(‖q‖²/2)·C·N·μ(q̃): equals exp_kde.
  static double exp_kde_lifted(const double* q, const double* k, index_t n, index_t d, const KdeLift& lift);
};

}  // namespace numattn
