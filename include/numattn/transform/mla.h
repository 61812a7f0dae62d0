/// @file mla.h
/// GQA → MLA conversion of one decoder layer (TransMLA: Meng, Tang, Tang, Yao, Sun, Zhang,
/// arXiv 2502.07864, NeurIPS 2025), into the multi-head latent attention form of DeepSeek-V2
/// (arXiv 2405.04434, §2.1) that `arch/mla_weights.h` runs.
///
/// Input: a GQA layer with Hq query heads, Hkv KV heads (group g of query head h: g = h / (Hq/Hkv),
/// contiguous groups), head width D, RoPE on the first n_rot dims of every head in the GGUF
/// `llama` adjacent-pair layout, pair i rotating with θ_i = rope_base^(−2i/n_rot), i < P = n_rot/2.
/// The conversion is a sequence of steps; the first two are exact rewrites, the last two are the
/// approximations that shrink the cache:
///
/// 1. **Merge** (exact). All KV heads form one key space of Hkv·D dims, read by every query head
///    through a 0/1 selector of its group: q_h · k_{g(h)} = (E_g q_h) · k with E_g q_h zero
///    outside group g's block. The latent is the values, [Hkv·D] (plus the key dims past n_rot,
///    which never rotate); the decoupled RoPE key is all Hkv·n_rot rotated key dims.
/// 2. **RoRoPE** (exact). For each frequency i the Hkv key pairs (x_g, y_g) = (k[gD+2i],
///    k[gD+2i+1]) are mixed by one real orthogonal U_i (Hkv×Hkv): x' = U_iᵀx, y' = U_iᵀy, and the
///    queries the same way, which leaves every RoPE score unchanged (both cos·(q_x·k_x + q_y·k_y)
///    and sin·(q_x·k_y − q_y·k_x) are invariant). U_i = eigenvectors, descending, of
///    Σx + Σy + δI, Σx = Cov(K_x) from the calibration (K = Xn·Wkᵀ, so Cov(K) = Wk·C·Wkᵀ),
///    δ = 1% of the mean diagonal (TransMLA's damping); component 0 then carries the most RoPE
///    energy. **FreqFold** M: M adjacent frequencies fM .. fM+M−1 (the group's *members*) share one
///    U_f of (Hkv·M)×(Hkv·M), indexed j = g·M + m. By Ky Fan, the energy in the top M components
///    of a folded group is at least the sum of its M frequencies' top components
///    (rorope_captured_energy).
/// 3. **RoPE removal** (lossy). rope_dims/2 rotated components keep RoPE and form the shared key
///    k_rope (d_rope = rope_dims, any even number up to Hkv·n_rot; `rope_heads` h stands for
///    h·n_rot): folded group f keeps its top k_f components, the k_f spread evenly over the
///    groups (rope_components; every group keeps the same number when rope_dims is a multiple of
///    n_rot/M, as in TransMLA). The other rotated components lose their rotation (in query and key)
///    and join the NoPE key, of width d_nope = Hkv·D − d_rope, with the never-rotated dims.
///    **Frequencies**: the c-th kept component of group f rotates at a member's own frequency
///    θ_{fM+m} (rope_member): in rounds of M, component c → member c mod M; a last partial round of
///    ρ < M components takes members spaced evenly, j·M/ρ (TransMLA: with its `collapse` κ a group
///    keeps M/κ components, at members 0, κ, 2κ, ...). A component mixes M frequencies, so no
///    single frequency is exact for it; a member's own frequency makes the rewrite exact whenever
///    the component only mixes heads within that member (U_f block-diagonal by member: the
///    identity, and every rotation of freqfold 1), and keeps the spread of frequencies that a
///    shared mean frequency would collapse (measured: docs/latent.md).
/// 4. **Balanced joint PCA** (lossy when truncated). The NoPE key and the values, z = [k_nope/α; v]
///    with α = b·α₀, α₀ = sqrt((E‖k_nope‖²/d_nope) / (E‖v‖²/(Hkv·D))) the ratio of their
///    root-mean-square entries (TransMLA *divides* the keys, whose entries are the larger, by the
///    ratio of mean per-dimension norms; RMS is what the covariance gives), are compressed to the
///    top r principal directions P_r of Cov(z) = W_z·C·W_zᵀ. The multiplier b (`balance`) trades
///    key error for value error: b > 1 shrinks the keys' share of the PCA. Equal energy per
///    entry (b = 1) is not optimal for the model's loss — on SmolLM2-135M b = √2–2 gave 1–2.5%
///    lower perplexity at 25–50% caches (docs/latent.md) — so the model-level default chooses b
///    on the calibration tokens (model/transform_model.h):
///    w_dkv = P_rᵀ·W_z, w_uk[h] = α·P_r[key rows], w_uv[h] = P_r[rows of group g(h)'s values].
///    The error in z is the sum of the discarded eigenvalues (it decreases with r). rank 0, or
///    rank >= d_nope + Hkv·D, keeps the latent [k_nope; v] as it is (no PCA, exact).
///
/// What is exact: with rope_dims = Hkv·n_rot (any freqfold) and rank 0 the MLA layer computes the
/// same scores and outputs as the GQA layer (rounding only; tests: 1e-12 in float64). RoRoPE alone
/// (rorope_merge with freqfold 1) is exact too. What is not: RoPE removal (the removed components
/// lose their position dependence), the frequency of a kept component that mixes members
/// (FreqFold M > 1 with a rotation), and truncation (rank < full width). No fine-tuning is done
/// (TransMLA's step 5).
///
/// Calibration (MlaCalibration): steps 2–3 use xn_cov; step 4 uses latent_xn_cov when given. The
/// model-level default (model/mla_convert.h, calib_mode two_pass) takes xn_cov from the original
/// model and latent_xn_cov from the model with RoPE removed from every layer, TransMLA's order:
/// the PCA then sees the inputs that the earlier layers' RoPE removal gives. Calibrating each
/// layer on the fully converted (also truncated) earlier layers (calib_mode sequential) was
/// measured worse on the default model (docs/latent.md, R7): the PCA then preserves the perturbed
/// inputs' keys and values, not the original model's.
///
/// KV cache per token and layer: rank + d_rope floats, against GQA's 2·Hkv·D.
/// Cost: O(Hkv·D·E²) for the covariance products, O((Hkv·D)³) for the eigendecompositions, and
/// O(Hq·Hkv·D·E) to rotate the queries; about 10 ms per layer of SmolLM2-135M.
/// Everything is float64; the model casts to float32 at load.
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/arch/hparams.h"
#include "numattn/arch/mla_weights.h"

namespace numattn::transform {

/// Options of the GQA -> MLA conversion (TransMLA).
/// Bad values throw numattn::OptionError naming the option: `mla_rank` (the `rank` field),
/// `freqfold`, `rope_heads`, `rope_dims`, `low_rank_query`.
struct MlaOptions {
  std::int64_t rank = 0;   ///< latent rank r of the NoPE-key + value latent; 0 = exact (no truncation)
  double balance = 1;      ///< b > 0: the keys' balance factor α = b·α₀ of step 4 (unused without truncation)
  int freqfold = 1;        ///< M adjacent RoPE frequencies folded together (1 = none)
  std::int64_t rope_dims = 0;  ///< dims of the decoupled RoPE key: even, 2..Hkv·n_rot; 0 = rope_heads·n_rot
  int rope_heads = 1;      ///< used when rope_dims = 0: KV heads' worth of RoPE dims (1..Hkv);
                           ///< all of them (rope_dims = Hkv·n_rot) with rank 0 is the exact merge
  bool low_rank_query = false; ///< optional; refused (not implemented: the MLA layer of
                               ///< arch/mla_weights.h has no query latent, so it would save nothing)
  std::int64_t query_rank = 0;
};

/// Calibration statistics of one layer: xn_cov = Σ_t xn_t xn_tᵀ / T over T calibration tokens,
/// [E, E] row-major float64 (xn = RMSNorm(x) ⊙ attn_norm, the input of Wq/Wk/Wv). Empty = identity.
/// Must be finite; it is used as given (symmetric up to rounding; only its symmetric part matters).
struct MlaCalibration {
  std::vector<double> xn_cov;
  std::int64_t tokens = 0;
  /// Optional: the statistics of the latent's PCA (step 4, and its balance α) when they are not
  /// xn_cov, same form; empty = xn_cov. TransMLA takes them from the model after RoPE removal
  /// (model/mla_convert.h, calib_mode two_pass), steps 2–3 from the original model.
  std::vector<double> latent_xn_cov;
};

/// Converts one GQA layer: wq [Hq·D, E], wk [Hkv·D, E], wv [Hkv·D, E] row-major float64 (GGUF
/// llama adjacent-pair RoPE layout, first n_rot dims of each head rotated with
/// θ_i = rope_base^(−2i/n_rot)). Throws numattn::Error for impossible options (names them):
/// rank < 0, freqfold < 1 or not dividing n_rot/2, rope_dims odd or outside 2..Hkv·n_rot,
/// rope_heads outside 1..Hkv, low_rank_query, weights or xn_cov of the wrong size or not finite,
/// hyper-parameters that ModelHParams::validate refuses. The result has softmax_scale =
/// 1/sqrt(D), d_v = D, d_rope = mla_rope_dims(hp, opt),
/// d_nope = Hkv·D − d_rope and rank = min(r, d_nope + Hkv·D) (r = 0: the full width).
MlaLayerWeights convert_layer_to_mla(const ModelHParams& hp, const std::vector<double>& wq,
                                     const std::vector<double>& wk, const std::vector<double>& wv,
                                     const MlaCalibration& calib, const MlaOptions& opt);

/// What a conversion kept, for reports (docs/latent.md).
struct MlaConversionStats {
  double rope_energy_kept = 1;   ///< share of the calibrated RoPE-key energy E‖k_rot‖² left in
                                 ///< k_rope (1 when rope_dims = Hkv·n_rot; without damping)
  double alpha = 1;              ///< the balance factor α = b·α₀ (step 4)
  double latent_energy_kept = 1; ///< share of E‖[k_nope/α; v]‖² in the kept principal directions
  std::int64_t full_width = 0;   ///< d_nope + Hkv·D, the latent width without truncation
};
/// As above, also filling *stats (when not null).
MlaLayerWeights convert_layer_to_mla(const ModelHParams& hp, const std::vector<double>& wq,
                                     const std::vector<double>& wk, const std::vector<double>& wv,
                                     const MlaCalibration& calib, const MlaOptions& opt,
                                     MlaConversionStats* stats);

/// RoRoPE basis of one layer (step 2): for each of the P/M folded frequency groups f (frequencies
/// fM .. fM+M−1), an orthogonal U_f of n = Hkv·M, indexed j = g·M + m (KV head g, frequency fM+m),
/// whose columns are the eigenvectors of Σx + Σy + δI in descending order of eigenvalue.
struct RoRopeBasis {
  int freqfold = 1;                           ///< M
  std::int64_t n = 0;                         ///< Hkv·M
  std::vector<std::vector<double>> u;         ///< [P/M] × (n×n row-major), column k = component k
  std::vector<std::vector<double>> eigenvalues;  ///< [P/M] × n, descending, damping included
};
/// Computes the basis from wk [Hkv·D, E] and the calibration (options checked as above).
RoRopeBasis rorope_basis(const ModelHParams& hp, const std::vector<double>& wk,
                         const MlaCalibration& calib, int freqfold);
/// Σ over groups of the top `keep` eigenvalues (the energy captured by keeping `keep` components
/// of every group: with keep = M, TransMLA's V_2 = Σ of the top M eigenvalues of each folded
/// group; with freqfold 1 and keep = 1, its V_1 = Σ of each frequency's top eigenvalue; V_2 ≥ V_1).
double rorope_captured_energy(const RoRopeBasis& basis, std::int64_t keep);

/// d_rope of `opt` for `hp`: opt.rope_dims, or rope_heads·n_rot when it is 0 (both checked).
std::int64_t mla_rope_dims(const ModelHParams& hp, const MlaOptions& opt);
/// [n_rot/2/freqfold] k_f: the rotated components that keep RoPE in each folded group, for
/// rope_dims/2 in all, spread evenly (the first groups, of the highest frequencies, take the
/// remainder). Throws OptionError for a bad freqfold or rope_dims.
std::vector<std::int64_t> rope_components(const ModelHParams& hp, int freqfold, std::int64_t rope_dims);
/// The member (0..freqfold−1) whose frequency the `component`-th of `kept` kept components of a
/// folded group rotates at (step 3).
std::int64_t rope_member(std::int64_t component, std::int64_t kept, int freqfold);
/// The RoPE frequencies (rad per position) of the d_rope/2 pairs of the decoupled key that
/// convert_layer_to_mla gives a layer: group by group, component c of group f at θ_{fM+m},
/// m = rope_member(c, k_f, M), θ_i = rope_base^(−2i/n_rot). What an MLA file's `rope_theta.ℓ`
/// must hold (model/mla_convert.h). Throws OptionError for a bad freqfold or rope_dims.
std::vector<double> mla_rope_theta(const ModelHParams& hp, int freqfold, std::int64_t rope_dims);

/// Steps 1–2 only: the GQA layer merged and rotated by `basis`, every rotated component kept as
/// RoPE (d_rope = Hkv·n_rot) and the latent uncompressed. An exact rewrite of the GQA layer when
/// every U_f only mixes heads within a member (column c nonzero only in rows g·M + c mod M):
/// always at freqfold 1 (identity 5); with M > 1 a general U_f mixes frequencies.
MlaLayerWeights rorope_merge(const ModelHParams& hp, const std::vector<double>& wq,
                             const std::vector<double>& wk, const std::vector<double>& wv,
                             const RoRopeBasis& basis);

}  // namespace numattn::transform
