/// @file tensor_heads.h
/// Training-free tensor compression of attention and feed-forward weights.
/// Everything is computed in float64 from the given weights; the model layer
/// (model/tensor_model.h) applies it to a Llama model.
///
/// ## Collaborative heads (Cordonnier, Loukas & Jaggi 2020)
/// Per layer, H query heads in G groups (GQA: head h uses group g(h) = h / (H/G)), each head a
/// product T_h = L_h·R_g(h) of a per-head n×D factor and a per-group D×m factor:
/// - VO side: L_h = W_O,h (E×D, head h's columns of W_o), R_g = W_V,g (D×E): T_h is the map
///   x_j ↦ W_O,h·W_V,g(h)·x_j that head h applies to the tokens it attends to;
/// - QK side (NoPE form only): L_h = W_Q,hᵀ (E×D), R_g = W_K,g (D×E): q_iᵀk_j = x_iᵀ T_h x_j.
///   With RoPE on a dimension, q_iᵀ R(p_j − p_i) k_j is not a bilinear form in (x_i, x_j) with a
///   position-free matrix, so the QK side is refused there (model layer: by name, as BDA does).
/// The stacked tensor 𝒯 (H × n × m, 𝒯(h, :, :) = T_h) is CP-decomposed at rank R:
///   T_h ≈ L'·diag(μ_h)·R'ᵀ,  L' (n × R) and R' (m × R) shared by all heads, μ_h = row h of M
///   (H × R, the CP weights λ folded in). VO: all heads share one value projection V' = R'ᵀ
///   (R × E: one value "head" of width R per token) and one output O' = L'; head h only
///   reweights the R shared value channels: y_i = Σ_h O'·diag(μ_h)·Σ_j P_h(i, j)·V'x_j.
/// Exact block form (`rank = 0`): R = H·D, L' = [L_0 … L_{H−1}], R' = [R_g(0)ᵀ … R_g(H−1)ᵀ],
/// μ_h one-hot on head h's D columns; it reproduces every T_h exactly (tests: 1e-10 in float64).
/// CP path: the tensor is first projected on orthonormal bases of the spans of the L_h columns
/// (when H·D < n) and of the R_g rows (when G·D < m; the VO side of a GQA layer: G·D = 192 of
/// E = 576 for SmolLM2) by thin QR. That loses nothing (every slice lies in those spans, and CP-ALS
/// iterates stay in them), and cuts the ALS cost by m/(G·D). Then `decomp::CpAls` (HOSVD start,
/// Bro line search) at rank R. Cost per sweep O(H·k_n·k_m·R), k = the projected sizes.
/// Parameters: before, H·n·D + G·D·m (the factors L_h, R_g); after, R·(n + m + H).
///
/// ## Tucker / shared factors of stacked weights (Ren et al. ICLR 2022; TRAWL, Luo et al.)
/// A stack of S matrices W_s (rows × cols; the same weight kind of every layer: all W_q, or all
/// W_gate) is the tensor 𝒳 (S × rows × cols). With `stack_rank` = 0 (or = S) the shared-factor
/// model W_s ≈ B·G_s·Cᵀ (`decomp::SharedFactor`, B rows × R1, C cols × R2 orthonormal, G_s
/// R1 × R2); with 1 ≤ stack_rank < S the full Tucker W_s ≈ B·(Σ_k A(s,k)·G_k)·Cᵀ (`decomp::Tucker`
/// by HOOI, a bank of stack_rank core slices G_k shared by all S matrices). Parameters: before
/// S·rows·cols; after S·R1·R2 + rows·R1 + cols·R2 (shared) or ℓ·R1·R2 + S·ℓ + rows·R1 + cols·R2
/// (Tucker). Cost: HOSVD O(size·(rows + cols)) then HOOI O(size·(R1 + R2)) per sweep.
///
/// Errors: numattn::Error for shapes that disagree, ranks outside their range (CP rank < 0;
/// Tucker ranks outside [1, dim]); decomposition trouble (no convergence in `max_iterations`,
/// CP degeneracy) is not an error: it is reported through `info` / `message`, the factors stay
/// usable and `fit` says how good they are.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "numattn/decomp/dense.h"
#include "numattn/arch/mla_weights.h"

namespace numattn::transform {

/// What a tensor compression spec compresses.
enum class TensorScheme {
  kVoCp,        ///< "vo-cp": collaborative VO heads, CP of W_O,h·W_V,g(h) per layer
  kQkCp,        ///< "qk-cp": collaborative QK heads (NoPE only: refused on RoPE dimensions)
  kTuckerQkvo,  ///< "tucker-qkvo": W_q, W_k, W_v, W_o each stacked over the layers
  kTuckerFfn,   ///< "tucker-ffn": W_gate, W_up, W_down each stacked over the layers
  kTuckerHeads, ///< "tucker-heads": per layer, W_q, W_k, W_v, W_o each as a heads × E × D tensor
};
const char* to_string(TensorScheme s);

/// A parsed `--tensor` spec: `SCHEME:key=value,...`, e.g. `vo-cp:rank=256`,
/// `tucker-qkvo:rank=128x256`, `tucker-ffn:rank=256,layers=8`.
/// Keys: `rank` (CP: R ≥ 0, 0 = the exact block form H·D; Tucker: R1 or R1xR2, ≥ 1, each clamped
/// to its matrix's dimension per weight kind; tucker-heads: R_E or R_ExR_D, clamped to E and D),
/// `layers` (tucker-qkvo/-ffn: the stack rank ℓ ≥ 1, default all layers = shared factors),
/// `exec` (vo-cp: `embedded`, the default, or `factored`, model/tensor_model.h),
/// `heads` (tucker-heads: the head-mode rank, ≥ 1, default all heads = one core per head; a
/// value ≥ a kind's head count means one core per head for that kind), `iters` (≥ 1; default 25
/// for CP, 10 for Tucker), `seed` (CP only; used where the HOSVD start pads with random columns).
struct TensorSpec {
  TensorScheme scheme = TensorScheme::kVoCp;
  std::int64_t rank = 0;    ///< CP rank R, or Tucker R1
  std::int64_t rank2 = 0;   ///< Tucker R2 (= rank when not given)
  std::int64_t layers = 0;  ///< Tucker stack rank ℓ (tucker-heads: over the heads); 0 = every slice (shared factors)
  int iters = 0;            ///< 0 = the scheme's default
  /// vo-cp only (`exec=factored`): run as factored collaborative VO layers (LlamaLayer::vo_mix:
  /// one shared R-wide value row per token) instead of the exact embedding at head dim max(D, R).
  bool factored = false;
  std::uint64_t seed = 1;
  bool is_cp() const { return scheme == TensorScheme::kVoCp || scheme == TensorScheme::kQkCp; }
  /// Sweeps actually run (iters, or the default of the scheme).
  int iterations() const { return iters > 0 ? iters : (is_cp() ? 25 : 10); }
  /// The canonical string (parse_tensor_spec(canonical()) gives this spec back).
  std::string canonical() const;
};
/// Parses a spec; throws numattn::OptionError("tensor", ...) naming the bad part and the grammar.
TensorSpec parse_tensor_spec(const std::string& s);
/// The grammar, for --help and error messages.
const char* tensor_spec_grammar();

struct CollabOptions {
  std::int64_t rank = 0;  ///< R ≥ 1, or 0 for the exact block form R = H·D
  int max_iterations = 25;
  double tolerance = 1e-7;  ///< on the change of the fit between sweeps
  std::uint64_t seed = 1;
};

/// T_h ≈ left·diag(mix(h, :))·rightᵀ for every head h.
struct CollabHeads {
  decomp::dense::Matrix left;   ///< n × R (VO: the shared output O'; QK: W̃_Q)
  decomp::dense::Matrix right;  ///< m × R (VO: V'ᵀ, the shared value projection; QK: W̃_K)
  decomp::dense::Matrix mix;    ///< H × R, per-head mixing vectors (CP weights folded in)
  bool block_form = false;      ///< the exact block form (rank 0) rather than CP-ALS
  double fit = 1;               ///< 1 − ‖𝒯 − 𝒯̂‖_F/‖𝒯‖_F (float64)
  int iterations = 0;
  decomp::dense::Info info = decomp::dense::Info::kSuccess;
  std::string message;
  std::int64_t params_before = 0, params_after = 0;
  std::int64_t rank() const { return left.cols(); }
  /// left·diag(mix(h, :))·rightᵀ (n × m).
  decomp::dense::Matrix head(std::int64_t h) const;
};

/// Collaborative heads of T_h = left[h]·right[h / (H/G)] (H = left.size(), G = right.size(),
/// left[h] n × D, right[g] D × m). Throws numattn::Error when H is not a multiple of G, shapes
/// disagree, rank < 0, or a factor is not finite.
CollabHeads collaborative_heads(std::span<const decomp::dense::Matrix> left,
                                std::span<const decomp::dense::Matrix> right, const CollabOptions& opt);

/// Collaborative QK heads on the NoPE part of an MLA layer (arch/mla_weights.h): head h scores
/// q_nope_h·k_nope_h = xnᵀ·T_h·c with T_h = W_q_nope[h]ᵀ·W_uk[h] (E × r, no RoPE on these
/// dimensions, so the bilinear form is position-free and the CP rewrite is legal). With the CP
/// T_h ≈ L'·diag(μ_h)·R'ᵀ (collaborative_heads with H groups of one head) the layer keeps its
/// shape except d_nope → R: W_q_nope'[h] = diag(μ_h)·L'ᵀ (R × E) and every W_uk'[h] = R'ᵀ (R × r)
/// (one shared key up-projection); the RoPE part, W_dkv, W_uv and the softmax scale are kept.
/// `rank = 0`: the exact block form R = Hq·d_nope. `E` is the model width. Cost as
/// collaborative_heads with n = E, m = r. Throws numattn::Error when d_nope = 0 (nothing to
/// compress), the weights do not have their shapes, or rank > Hq·d_nope; `heads` receives the
/// decomposition's report.
MlaLayerWeights collaborative_qk_mla(const MlaLayerWeights& w, std::int64_t E, const CollabOptions& opt,
                                     CollabHeads* heads = nullptr);

struct StackOptions {
  std::int64_t rank_rows = 1, rank_cols = 1;  ///< R1 ∈ [1, rows], R2 ∈ [1, cols]
  std::int64_t stack_rank = 0;                 ///< 0 or S: shared factors; else ℓ ∈ [1, S)
  int max_iterations = 10;
  double tolerance = 1e-7;
};

struct StackCompression {
  std::vector<decomp::dense::Matrix> approx;  ///< the rebuilt W_s (rows × cols), one per slice
  /// The factors: W_s ≈ left·C_s·rightᵀ with C_s = cores[s] (shared factors: `coef` empty, one
  /// core per slice) or C_s = Σ_k coef(s, k)·cores[k] (Tucker: `coef` S × ℓ, ℓ cores).
  decomp::dense::Matrix left;                ///< rows × R1, orthonormal columns (B)
  decomp::dense::Matrix right;               ///< cols × R2, orthonormal columns (C)
  std::vector<decomp::dense::Matrix> cores;  ///< R1 × R2 each (S of them, or ℓ)
  decomp::dense::Matrix coef;                ///< S × ℓ (A), or empty
  double fit = 1;                              ///< over the whole stack
  std::vector<double> slice_fit;               ///< 1 − ‖W_s − Ŵ_s‖/‖W_s‖ per slice
  int iterations = 0;
  decomp::dense::Info info = decomp::dense::Info::kSuccess;
  std::string message;
  std::int64_t params_before = 0, params_after = 0;
};

/// Tucker / shared-factor compression of a stack of equally shaped matrices (file comment).
/// Throws numattn::Error for an empty stack, mismatched shapes, a non-finite entry, or ranks out
/// of range.
StackCompression compress_stack(std::span<const decomp::dense::Matrix> mats, const StackOptions& opt);

}  // namespace numattn::transform
