#pragma once

#include <cstdint>
#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.hyper(block=256, samples=256, bits=7, min_seq_len=4096, seed=0)`: HyperAttention (Han,
/// Jayaram, Karbasi, Mirrokni, Woodruff, Zandieh, ICLR 2024), as the official `hyper_attn.py`
/// runs it (keys sampled uniformly, not by the squared row norms of V).
///
/// Non-causal routine, on n_q queries and n_k keys of one head:
/// 1. SimHash with `bits` sign projections (the same directions for q and k: one draw per KV
///    head, blocks/lsh.h), codes mapped to their Gray rank; queries and keys are stably sorted
///    separately by (rank, index).
/// 2. nb = ceil(n_k/block) blocks; sorted key block β = [β·n_k/nb, (β+1)·n_k/nb), sorted query block
///    β = [β·n_q/nb, (β+1)·n_q/nb) (query block size n_q/nb, as the official code). Each query
///    attends exactly to the keys of its block.
/// 3. `samples` = m key positions u_1..u_m drawn uniformly with replacement from [0, n_k) (shared by
///    all queries of the routine). For block β, draws inside the block get −inf; the m'_β others
///    are, given m'_β, uniform draws from the n_rem = n_k − |block β| remaining keys, so
///    R̂_i = (n_rem/m'_β)·Σ_{t: u_t ∉ β} exp(s_iu_t)·v_u_t is an unbiased estimate of the residual
///    Σ_{j∉β} exp(s_ij)·v_j (and likewise for the normaliser) whenever m'_β > 0: the sampled
///    logits are raised by log(n_rem/m'_β). (The official code adds log(n_k/m) over all m draws;
///    that is the unconditional form of the same estimator, with more variance.) m'_β = 0: no
///    residual term (bias).
/// 4. The block part and the sampled part are one softmax over [block keys ∪ draws]
///    (blocks/tile_softmax.h): (o, lse) with lse = log of the estimated normaliser; unsort.
/// If n_k ≤ block, or max(n_q, n_k) < min_seq_len (strictly, as the official code), the routine is
/// exact (flash kernel); the whole problem is exact when max(Nq, Nk) ≤ min_seq_len.
///
/// Causal (Algorithm 4, CausalApproxD): rows i with i + off < 0 see no key (0, lse −inf); rows
/// that see every key run the non-causal routine; the rest [q0, q1) with keys [0, q1 + off) is
/// split recursively: queries [a, c) in halves at b, keys of the first half [k_a, b + off) (causal,
/// recursive), the second half's diagonal keys [b + off, c + off) (causal, recursive) and its
/// off-diagonal keys [k_a, b + off) (all visible: the non-causal routine), merged by log-sum-exp.
/// A part with max(rows, keys) ≤ min_seq_len is exact causal attention (flash kernel, bottom-right
/// alignment of the part, which reproduces the global rule j ≤ i + off for both alignments).
/// Draws are keyed by (seed, batch·Hq + head, recursion node), so nothing depends on threads.
///
/// Target: softmax. LSE: the log of the estimated normaliser of what is output (exact where the
/// method is exact). Limits: min_seq_len ≥ max(Nq, Nk), or block ≥ Nk, is exact attention.
/// Cost (non-causal): O(N·(bits·Dk + (block + samples)·(Dk + Dv))) + sorts O(N + 2^bits);
/// causal: O(N·log(N/min_seq_len)·(block + samples)·(Dk+Dv) + N·min_seq_len·(Dk+Dv)).
/// No masks, no window. Refuses nothing else.
class HyperAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// Gray ranks of the SimHash codes of query head (b, h)'s rows (`keys` = false) or of its KV
  /// head's first `n` key rows (`keys` = true), as the method sorts them (for tests).
  std::vector<std::uint32_t> ranks(const AttentionProblem& p, index_t b, index_t h, bool keys, index_t n) const;
  /// The m sorted-key positions in [0, n_k) drawn for query head (b, h) at recursion node `node`
  /// (1 = the non-causal routine of the whole problem) (for tests).
  std::vector<index_t> draws(const AttentionProblem& p, index_t b, index_t h, std::uint64_t node, index_t n_k) const;
};

}  // namespace numattn
