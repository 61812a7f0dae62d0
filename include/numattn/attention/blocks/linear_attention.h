/// @file linear_attention.h
/// Kernelised ("linear") attention with a finite feature map, non-causal and causal, shared by
/// every kernel method (Performer, linear attention, PolySketch, TensorSketch).
///
/// With feature rows φ(q_i), φ(k_j) ∈ R^M and the rule of problem.h for which keys row i sees:
///
///     num_i = Σ_{j seen} (φ(q_i)·φ(k_j)) v_j,   den_i = Σ_{j seen} φ(q_i)·φ(k_j)
///     out_i = num_i / (c + den_i)   (0 when c + den_i = 0; den_i clamped at 0 first if asked)
///
/// Non-causal: Y = Φ_Q (Φ_Kᵀ [V | 1]) in O(N·M·Dv). Causal (`Causal::kTopLeft` and
/// `kBottomRight`, any Nq, Nk): row i sees keys j < E(i) = clamp(i + off + 1, 0, Nk), off the
/// diagonal offset of problem.h.
/// - `CausalAlgo::kBlock` (PolySketch's block lower-triangular multiply): query rows in chunks of
///   b; a chunk [i0, i1) takes the prefix state Σ_{j<E(i0)} φ(k_j)[v_j | 1]ᵀ (M × (Dv+1)) times
///   its query features (one GEMM) plus tril(Φ_Q Φ_Kᵀ)[V | 1] over its own diagonal keys
///   [E(i0), E(i1−1)) (two GEMMs). The prefix states are per-segment GEMMs summed by an exclusive
///   scan in float64, so every step is a GEMM and the result does not depend on the thread count.
///   O(N·M·Dv + N·b·(M + Dv)) time, O((N/b)·M·(Dv+1)) memory per KV head.
/// - `CausalAlgo::kPrefix` (Performer's prefix sums): the token-level recurrence
///   S_i = S_{i−1} + Σ_{new keys} φ(k_j)[v_j | 1]ᵀ, out_i from φ(q_i)ᵀ S_i, state in float64.
///   O(N·M·Dv) without GEMMs; the constant-size state is the decode-time "KV cache".
///
/// Self-tensoring (PolySketch): the caller gives ψ ∈ R^m and the feature is φ = ψ ⊗ ψ (M = m²),
/// so φ(q)·φ(k) = (ψ(q)·ψ(k))² ≥ 0; the diagonal blocks use the squared m-dimensional products
/// and never form φ of the keys there.
///
/// Masks and sliding windows are not supported (methods refuse them); GQA reads kv head
/// h / (Hq/Hkv) and shares its key features. Keys no query sees (beyond E(Nq−1)) are never read.
/// A NaN or ±inf in a feature or value reaches exactly the rows that see it.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "numattn/attention/problem.h"
#include "numattn/core/exec.h"

namespace numattn::blocks {

/// How a method normalises: out = num / (shift + den), den ← max(den, 0) first when
/// `clamp_nonneg` (signed features: an estimate of a non-negative sum that came out negative).
/// A zero denominator gives a zero row (a row that sees no key, or features that all vanish).
struct Denominator {
  double shift = 0;
  bool clamp_nonneg = false;
};

enum class CausalAlgo { kBlock, kPrefix };

struct LinearAttentionConfig {
  index_t feature_dim = 0;   ///< m: columns of ψ written by the feature callbacks
  bool self_tensor = false;  ///< φ = ψ ⊗ ψ (M = m²) instead of φ = ψ (M = m)
  CausalAlgo causal_algo = CausalAlgo::kBlock;
  index_t chunk = 128;       ///< b: query rows per block (causal) and key rows per state segment
  Denominator den;
};

/// Writes ψ of rows [row0, row0 + rows) of query head (b, h): `rows × feature_dim`, row-major.
/// Called concurrently from parallel_for workers (must be thread-safe, deterministic).
using FeatureFn = std::function<void(index_t b, index_t h, index_t row0, index_t rows, float* psi)>;

/// Number of keys that some query sees (Nk without a causal rule): the only keys read.
index_t keys_read(const AttentionProblem& p);

/// Key features for every (b, kv head): `[B·Hkv][keys_read(p)][feature_dim]` contiguous, filled
/// by `fn(b, hk, row0, rows, out)` (called in parallel over heads and segments of rows).
std::vector<float> key_features(const AttentionProblem& p, index_t feature_dim, const FeatureFn& fn,
                                const ExecContext& ctx);

/// Computes `p.out` (see the file comment). `keys` is the layout of `key_features`.
void linear_attention(const AttentionProblem& p, const LinearAttentionConfig& cfg, const FeatureFn& query,
                      const float* keys, const ExecContext& ctx);

/// Scratch `linear_attention` allocates (bytes), excluding the key features.
std::size_t linear_attention_workspace(const AttentionProblem& p, const LinearAttentionConfig& cfg,
                                       const ExecContext& ctx);

/// Exact polynomial attention out_i = Σ_j (s·q_i·k_j)^p v_j / (c + Σ_j (s·q_i·k_j)^p) over the keys
/// row i sees (causal rules as above; no masks), in float32 with materialised score blocks:
/// O(Nq·Nk·(Dk + Dv)) time. The exact-tensor limit of the sketched polynomial methods
/// (⟨x^{⊗p}, y^{⊗p}⟩ = (x·y)^p, without forming the d^p-dimensional features). Refuses (Error)
/// inputs whose p-th powers leave float32.
void exact_polynomial_attention(const AttentionProblem& p, int degree, double shift, const ExecContext& ctx);
/// Scratch `exact_polynomial_attention` needs (bytes).
std::size_t exact_polynomial_workspace(const AttentionProblem& p, const ExecContext& ctx);

/// Sketched polynomial attention, the shared pipeline of kernel.polysketch and
/// kernel.tensorsketch: out_i = Σ_j w_ij v_j / (1 + Σ_j w_ij) with w_ij = ⟨φ(q_i), φ(k_j)⟩ (made
/// ⟨ψ, ψ⟩² when `cfg.self_tensor`). `phi(x, b, h, hk, row0, rows, out)` writes the m = cfg.feature_dim
/// sketched features of rows [row0, row0 + rows) of head h of x (q or k; hk is the KV head whose
/// sketch applies) and must be thread-safe. The features are used as they come: no row depends on
/// a key it does not see (causal), not even through a common scale. Rows with non-finite inputs
/// get NaN features. Refuses (Error, naming `name`) a query row whose weighted sums could leave
/// float32: (keys seen)·max(1, (‖ψ(q_i)‖·max‖ψ(k_j)‖)^e)·max(1, max|v_j|) > 1e36 over the keys j
/// it sees (finite ones), e = 2 self-tensored, else 1.
using SketchFn = std::function<void(const TensorView<const float>& x, index_t b, index_t h, index_t hk,
                                    index_t row0, index_t rows, float* out)>;
void sketched_polynomial_attention(const AttentionProblem& p, const LinearAttentionConfig& cfg, const SketchFn& phi,
                                   const char* name, const ExecContext& ctx);
/// Scratch `sketched_polynomial_attention` needs (bytes), key features included.
std::size_t sketched_polynomial_workspace(const AttentionProblem& p, const LinearAttentionConfig& cfg,
                                          const ExecContext& ctx);

}  // namespace numattn::blocks

namespace numattn::blocks {

/// Largest finite norms of what a kernel method reads (NaN/inf rows are skipped: they reach the
/// output through the computation and `run` names them): ‖q_i‖ over all query rows, ‖k_j‖ and
/// max|v_jd| over the keys some query sees. For the overflow guards of the methods.
struct InputNorms {
  double q = 0, k = 0, v = 0;
};
InputNorms input_norms(const AttentionProblem& p, const ExecContext& ctx);

/// The largest finite Euclidean norm of `rows` rows of m features (row-major).
double max_row_norm(const float* rows_data, index_t rows, index_t m);

/// Sets to NaN each of the `rows` feature rows in `psi` (`rows` × m) whose input row
/// x[b, h, row0 + i] is not finite: a sketch or a product with a zero could otherwise cancel or
/// drop the NaN/inf, and `run` must see it to name the input.
void poison_nonfinite_rows(const TensorView<const float>& x, index_t b, index_t h, index_t row0, index_t rows,
                           float* psi, index_t m);

}  // namespace numattn::blocks
