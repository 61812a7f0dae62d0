/// @file tensor_forms.h
/// Attention forms with tensor products whose inputs the AttentionProblem interface cannot carry
/// (tensor-valued tokens, per-token factor tensors, a sequence-length-dependent output map), as
/// documented functions, each with a float64 oracle written apart from the fast code.
/// 2-simplicial attention, which fits the interface, is a registered method
/// (attention/simplicial.h, `tensor.simplicial`).
///
/// Layouts: all buffers are contiguous row-major float32 (oracles: float64 results).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/core/tensor.h"

namespace numattn {

// ---------------------------------------------------------------------------------------------
// Tensor-valued inputs: X ∈ R^{N1×N2×D}, token (a, b) at offset (a·N2 + b)·D.

/// HOT mode-wise attention, one head (Omranpour, Rabusseau & Rabbany 2024):
///   S1 = softmax_rows(s1 · Q_(1) K_(1)ᵀ)  (N1 × N1),  Q_(1) = Q as N1 × (N2·D), s1 = 1/√(N2·D)
///   S2 = softmax_rows(s2 · Q_(2) K_(2)ᵀ)  (N2 × N2),  Q_(2) = Q as N2 × (N1·D), s2 = 1/√(N1·D)
///   O[:, :, c] = S1 · V[:, :, c] · S2ᵀ   for every value channel c,
/// i.e. the N1N2 × N1N2 attention matrix S1 ⊗ S2 (row-stochastic) applied to the N1N2 tokens,
/// through (S1 ⊗ S2)·vec(V_c) = vec(S1 V_c S2ᵀ) (row-major vec), without forming it. Each mode's
/// scores see the other mode flattened into the features (the mode-n unfolding).
/// Cost: 2·N1·N2·(N1 + N2)·(D + Dv) flops (four sgemm), memory O(N1² + N2² + N1·N2·(D + Dv)).
/// q, k: N1·N2·D; v, out: N1·N2·Dv. Throws numattn::Error on a size < 1.
void hot_modewise_attention(const float* q, const float* k, const float* v, index_t n1, index_t n2, index_t d,
                            index_t dv, float* out);
/// The same operator, dense: forms S1 ⊗ S2 as an N1N2 × N1N2 float32 matrix and multiplies it
/// with V (sgemm). Cost 2·(N1N2)²·Dv + the mode scores; memory 4·(N1N2)² bytes. The naive form
/// the benchmark compares the mode-wise one with.
void hot_dense_attention(const float* q, const float* k, const float* v, index_t n1, index_t n2, index_t d,
                         index_t dv, float* out);
/// Float64 oracle of the HOT operator: S1, S2 by their definition, O[a,b,c] =
/// Σ_{a',b'} S1[a,a']·S2[b,b']·V[a',b',c] summed pair by pair, O((N1N2)²·Dv).
std::vector<double> hot_reference(const float* q, const float* k, const float* v, index_t n1, index_t n2, index_t d,
                                  index_t dv);

/// Axial attention (Ho et al. 2019), one head: softmax attention along axis 2
/// (token (a, b) attends over (a, b') with logits s·q_ab·k_ab'), then along axis 1 on the
/// result (token (a, b) attends over (a', b) with logits s·q_ab·k_a'b and values Y_a'b), s =
/// 1/√D. Both passes run exact.flash on strided views (no copies); `causal` makes each axis
/// causal (b' ≤ b, a' ≤ a). As one N1N2 × N1N2 matrix A[(a,b),(a',b')] = P^col_b[a,a']·
/// P^row_a'[b,b']. Cost O(N1·N2·(N1 + N2)·(D + Dv)); any Dv.
void axial_attention(const float* q, const float* k, const float* v, index_t n1, index_t n2, index_t d, index_t dv,
                     bool causal, float* out, const ExecContext& ctx);
/// Float64 oracle: forms the dense A above row by row and applies it, O((N1N2)²·Dv).
std::vector<double> axial_reference(const float* q, const float* k, const float* v, index_t n1, index_t n2,
                                    index_t d, index_t dv, bool causal);

// ---------------------------------------------------------------------------------------------
// Tensor Product Attention (Zhang et al. 2025, T6).

/// Per-token factors of one of Q, K, V: a `[N, R, H]` (head factors) and b `[N, R, Dh]` (feature
/// factors), row-major; the token's H × Dh slice is X_n = (1/R)·Σ_r a_{n,r} ⊗ b_{n,r}.
struct TpaFactors {
  const float* a = nullptr;
  const float* b = nullptr;
  index_t rank = 0;
};

/// Bytes of the factorised KV cache of N tokens, (R_K + R_V)·(H + Dh) floats per token, and of
/// the MHA cache it replaces, 2·H·Dh floats per token.
std::size_t tpa_cache_bytes(index_t n, index_t heads, index_t head_dim, index_t rank_k, index_t rank_v);
std::size_t mha_cache_bytes(index_t n, index_t heads, index_t head_dim);

/// TPA forward from the factorised cache: in parallel over heads, each worker rebuilds its head's
/// Q_h, K_h, V_h (N × Dh) from the cached factors and runs exact causal (or not) softmax
/// attention on them (exact.flash), scale 1/√Dh. out `[H, N, Dh]`. The cache is never expanded
/// to N × H × Dh (peak extra memory 3·N·Dh floats per worker).
/// Cost: N·H·Dh·(R_Q + R_K + R_V)·2 to rebuild + standard attention. Throws numattn::Error on a
/// rank < 1 or a size < 1.
void tpa_attention(const TpaFactors& q, const TpaFactors& k, const TpaFactors& v, index_t n, index_t heads,
                   index_t head_dim, bool causal, float* out, const ExecContext& ctx);
/// Float64 oracle: rebuilds Q, K, V entry by entry from the factors and sums softmax rows.
std::vector<double> tpa_reference(const TpaFactors& q, const TpaFactors& k, const TpaFactors& v, index_t n,
                                  index_t heads, index_t head_dim, bool causal);

// ---------------------------------------------------------------------------------------------
// Multi-linear attention (Ma et al. NeurIPS 2019), float64 (a study form: its
// output map depends on N, and it has no softmax).

/// A(i, j, m) = Σ_r g_r Q(i,r) K(j,r) V(m,r) (a CP tensor [[g; Q, K, V]], N×N×N), output
/// O = A_(1)·W^O with A_(1)[i, j + N·m], W^O `[N², Dout]` row j + N·m.
/// Contraction order: U = Vᵀ·W^O viewed as N × (N·Dout) (one dgemm, R × N·Dout), then
/// M[r, :] = Σ_j K(j, r)·U[r, j, :], then O = Q·diag(g)·M. Cost 2·N²·R·Dout + O(N·R·Dout);
/// never forms the N³ tensor nor the N² × R Khatri–Rao product. Several heads that share Q, K, V
/// and average their tensors are the same operator with g = the mean of the heads' cores.
/// q, k, v `[N, R]`; w_o `[N², Dout]`; returns O `[N, Dout]`.
std::vector<double> multilinear_attention(const double* q, const double* k, const double* v, const double* g,
                                          const double* w_o, index_t n, index_t rank, index_t d_out);
/// Materialised oracle: forms A (N³) and A_(1)·W^O directly, O(N³·(R + Dout)).
std::vector<double> multilinear_reference(const double* q, const double* k, const double* v, const double* g,
                                          const double* w_o, index_t n, index_t rank, index_t d_out);

}  // namespace numattn
