/// @file simplicial.h
/// 2-simplicial attention with sliding windows (Clift et al. 2019; Roy et al. 2025, "Fast and
/// Simplex"): softmax over *pairs* of keys with a trilinear logit.
///
/// Definition (the float64 oracle `simplicial_reference_row` and the float32 kernel
/// `simplicial_attention` both follow it; `tensor.simplicial(w1, w2)` registers it with
/// K' = K and V' = V). For query row i of problem p (problem.h shapes; K', V' have K's and V's
/// shapes), with diagonal position t = i + p.diag_offset() (Nk − Nq for bottom-right, else 0):
///   J_i = key_range(i) ∩ [t − w1 + 1, t]     (the w1 keys ending at the diagonal)
///   K_i = key_range(i) ∩ [t − w2 + 1, t]
///   ℓ_i(j, k) = s · Σ_d q_id k_jd k'_kd       (s = p.effective_scale())
///   out_i = Σ_{j∈J_i, k∈K_i} softmax_{(j,k)}(ℓ_i) · (v_j ⊙ v'_k),  lse_i = log Σ exp ℓ_i(j, k).
/// key_range carries the causal rule and the problem's sliding window; windows end at the
/// diagonal even without a causal rule, so the cost is bounded by w1·w2 pairs per row. A row
/// with J_i or K_i empty gives 0 and lse −inf. Masks (boolean, additive) are not part of it.
/// Query head h reads kv head h / (Hq / Hkv) of K, V, K' and V'. Dv of V and V' must agree.
///
/// Cost: O(Nq·w1·w2·(Dk + Dv)) time per head; the FLOP model is 2·(Σ_i |J_i|·|K_i|)·(Dk + Dv)
/// (`simplicial_flops`), the trilinear logit counted as 2·Dk per pair because s·q ⊙ k'_k is
/// formed once per (i, k) and every pair then costs one Dk-long dot product.
///
/// Edges: what a row reads (q_i, k_j, v_j for j ∈ J_i, k'_k, v'_k for k ∈ K_i) must be finite:
/// the oracle raises NonFiniteInput naming the first bad element in the order q, k (J_i), k'
/// (K_i), v (J_i), v' (K_i); the kernel reads nothing else and lets non-finite values reach
/// the row's output (AttentionMethod::run then settles it, problem.h).
#pragma once

#include "numattn/attention/problem.h"
#include "numattn/core/exec.h"

namespace numattn {

/// J_i (window w1) or K_i (window w2) of the definition above.
KeyRange simplicial_range(const AttentionProblem& p, index_t i, index_t window);

/// 2·(Σ_{b,h,i} |J_i|·|K_i|)·(Dk + Dv).
double simplicial_flops(const AttentionProblem& p, index_t w1, index_t w2);

/// Float64 row (b, h, i) of 2-simplicial attention, by direct summation over the pairs with
/// the max-shifted exponentials: writes Dv doubles, returns the LSE (−inf for an empty row).
/// `logit_magnitude` (optional) receives L = the largest |s|·Σ_d|q_d k_jd k'_kd| over pairs
/// whose weight is at least e^-104 of the largest (the bound of the float32 logit's partial
/// sums, as for softmax in reference.h). Throws NonFiniteInput as documented above.
double simplicial_reference_row(const AttentionProblem& p, const TensorView<const float>& k2,
                                const TensorView<const float>& v2, index_t w1, index_t w2, index_t b,
                                index_t h, index_t i, double* out_row, double* logit_magnitude = nullptr);

/// Float32 2-simplicial attention into p.out (and p.lse when requested): per query row, the
/// j-window is walked in tiles of 64 keys with an online softmax over the tile's pairs (running
/// max and normaliser rescaled between tiles); per tile the logits are one (tile × Dk)·(Dk × |K_i|)
/// product against W = (s·q_i) ⊙ K'_{K_i}ᵀ, the values U_j = Σ_k P_jk v'_k one (tile × |K_i|)·
/// (|K_i| × Dv) product, and out += Σ_j v_j ⊙ U_j. The row kernel is register-blocked AVX-512
/// or AVX2+FMA, or portable loops, as the library's CPU path says (core/cpu.h; tests run every
/// path this CPU has). Parallel over (batch, head, blocks of 64 query rows). Throws numattn::Error on
/// inconsistent shapes, windows < 1, masks, or Dv(V) ≠ Dv(V'), and on a query row whose own
/// windows hold values with max|v|·max|v'|·|J_i|·|K_i| > 1e37 (finite values; its sums would leave
/// float32): only the values a row reads count, so values beyond a causal row's windows never
/// refuse it.
void simplicial_attention(const AttentionProblem& p, const TensorView<const float>& k2,
                          const TensorView<const float>& v2, index_t w1, index_t w2, const ExecContext& ctx);

/// Scratch bytes `simplicial_attention` allocates on `threads` threads.
std::size_t simplicial_workspace_bytes(const AttentionProblem& p, index_t w1, index_t w2, int threads);

}  // namespace numattn
