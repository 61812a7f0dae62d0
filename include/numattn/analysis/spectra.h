/// @file spectra.h
/// Structure of one attention head in float64: singular values and ranks of Q, K, V, of the
/// logits S, of A = exp(S) and of the softmax matrix P; row entropy, top-k mass and attention
/// sinks of P; the 20×20 sparsity panels of the Llama 3.2 experiment of the survey (Serret et
/// al., "Attention Mechanisms Through the Lens of Numerical Methods", arXiv 2604.01757, 2026;
/// Figs. 5, 7, 8). Used by `numattn analyze`
/// (docs/analysis.md), which writes these numbers per layer and head.
///
/// Matrices of one head (Q: Nq×d, K: Nk×d, `scale` explicit, causal rule of problem.h and an
/// optional sliding window of W keys):
/// - S = scale·Q·Kᵀ (Nq×Nk), no mask: its rank is at most d.
/// - Visibility: row i sees the keys [lo_i, hi_i) (`visible_ranges`): hi_i from the causal rule,
///   and with a window lo_i = max(0, i + off − W + 1), the keys i + off − W + 1 .. i + off, which
///   is problem.h's window_left = W − 1 (a sliding-window layer of a model such as Gemma 3:
///   W = 512 keys, the query's own included). W = 0 means no window (lo_i = 0). A window of
///   W ≥ Nk keys under a bottom-right rule hides nothing.
/// - A_ij = exp(S_ij − m_i) on the keys row i sees (0 elsewhere), m_i = max over those keys.
///   Scaling: the survey's exp(S) may overflow, so each row is shifted by its own maximum;
///   A = diag(e^{−m})·exp(S)⊙M. A is therefore determined only up to a positive diagonal
///   factor on the left; P is not affected (the diagonal cancels in Z⁻¹A), but σ(A) is: it is
///   the spectrum of the row-equilibrated exp(S) (every row has max 1). `global_shift_a`
///   gives the other natural choice, exp(S − max S)⊙M, a scalar multiple of exp(S)⊙M, whose
///   σ_k/σ_1 equal those of exp(S) exactly (when no visible entry underflows).
/// - P = Z⁻¹A, Z = diag(A·1): rows sum to 1; a row that sees no key is 0.
///
/// Cost per head: O(Nq·Nk·d) for S and O(Nq·Nk·min(Nq, Nk)) for each SVD (LAPACK dgesdd through
/// decomp/dense.h); memory a few Nq×Nk doubles.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "numattn/attention/problem.h"
#include "numattn/core/exec.h"
#include "numattn/decomp/dense.h"

namespace numattn::analysis {

using decomp::dense::Matrix;
using decomp::dense::Vector;

// ---- spectra ------------------------------------------------------------------------------

/// #{i : σ_i > rel_tol·σ_1} for σ descending (0 for an empty or all-zero spectrum).
std::int64_t numerical_rank(const Vector& sigma, double rel_tol);
/// Smallest r with Σ_{i≤r} σ_i² ≥ fraction·Σ σ_i² (0 for an all-zero spectrum); fraction in (0, 1].
std::int64_t energy_rank(const Vector& sigma, double fraction);
/// ‖M‖_F² / ‖M‖_2² = Σσ_i²/σ_1², in [1, n] (0 for the zero matrix).
double stable_rank(const Vector& sigma);
/// sqrt(Σ_{i>r} σ_i² / Σ σ_i²): by Eckart–Young the smallest ‖M − X‖_F/‖M‖_F over all X of rank
/// ≤ r, so no rank-r approximation of M does better in the relative Frobenius norm. 0 for r ≥ n.
double tail_rel_fro(const Vector& sigma, std::int64_t r);

/// The stats.csv columns of one spectrum.
struct SpectrumStats {
  std::int64_t n = 0;               ///< number of singular values, min(rows, cols)
  double sigma1 = 0;                ///< σ_1 = ‖M‖_2
  std::int64_t rank_rel = 0;        ///< numerical_rank(σ, 1e-2)
  std::int64_t rank_energy = 0;     ///< energy_rank(σ, 0.9)
  double stable_rank = 0;
};
SpectrumStats spectrum_stats(const Vector& sigma);

/// Singular values (descending) of `m` in float64, LAPACK dgesdd. Throws numattn::Error naming
/// `what` if LAPACK fails or `m` holds a NaN or an infinity.
Vector singular_values(const Matrix& m, const char* what);

// ---- the matrices of one head -----------------------------------------------------------------

/// The keys each row sees, [begin, end) per row, under `causal` and a sliding window of `window`
/// keys (0 = none): problem.h's rule (AttentionProblem::key_range) with window_left = window − 1
/// and no window_right or mask. With off = Nk − Nq for bottom-right, 0 otherwise: end =
/// clamp(i + 1 + off, 0, Nk) under a causal rule (Nk for kNone), begin = clamp(i + off − window
/// + 1, 0, end) with a window (0 without). Throws numattn::Error for a negative window.
std::vector<KeyRange> visible_ranges(std::int64_t nq, std::int64_t nk, Causal causal, std::int64_t window = 0);
/// The number of keys each row sees (end − begin of `visible_ranges`): without a window Nk for
/// kNone and clamp(i + 1 + off, 0, Nk) otherwise.
std::vector<std::int64_t> visible_keys(std::int64_t nq, std::int64_t nk, Causal causal, std::int64_t window = 0);
/// The counts of `ranges`.
std::vector<std::int64_t> range_sizes(const std::vector<KeyRange>& ranges);

struct HeadMatrices {
  Matrix s;  ///< scale·Q·Kᵀ, unmasked
  Matrix a;  ///< exp(S − m_i) on visible keys, 0 elsewhere (row-max shift, see the file comment)
  Matrix p;  ///< Z⁻¹A
};
/// S, A, P of one head from Q (Nq×d) and K (Nk×d), on the keys `visible_ranges(Nq, Nk, causal,
/// window)` leaves each row: A and P are 0 outside [lo_i, hi_i), and each row of P sums to 1 over
/// exactly those keys. Throws numattn::Error for different d, a non-finite or non-positive scale,
/// a negative window, or a non-finite entry of S.
HeadMatrices head_matrices(const Matrix& q, const Matrix& k, double scale, Causal causal, std::int64_t window = 0);

/// exp(S − max over all visible S)⊙M: exp(S)⊙M up to one scalar factor (see the file comment),
/// M the causal rule and the window.
Matrix global_shift_a(const Matrix& s, Causal causal, std::int64_t window = 0);

// ---- rows of P ------------------------------------------------------------------------------

/// −Σ_j P_ij·ln P_ij (nats; 0·ln 0 = 0) per row. A uniform row over v keys gives ln v, a
/// one-hot row 0.
Vector row_entropy(const Matrix& p);
/// Sum of the k_i largest entries of row i (k_i clipped to [0, Nk]), per row. For a stochastic
/// row, 1 − topk mass is the least ℓ1 error ‖P_i − P̂_i‖_1 of any P̂_i with at most k_i nonzeros
/// (the mass outside the kept keys is lost whatever they are given).
Vector topk_mass(const Matrix& p, const std::vector<std::int64_t>& k_per_row);
/// k_i = min(k, visible_i) (the same k for every row).
std::vector<std::int64_t> fixed_k(const std::vector<std::int64_t>& visible, std::int64_t k);
/// k_i = ceil(frac·visible_i): a fraction of each row's visible keys.
std::vector<std::int64_t> fraction_k(const std::vector<std::int64_t>& visible, double frac);

/// Mean attention each key receives, c_j = (1/R)·Σ_i P_ij over the R rows that see some key
/// (Σ_j c_j = 1): the share of the head's total attention that lands on key j.
Vector key_share(const Matrix& p);
/// What key_share would be if every row attended uniformly to its visible keys [lo_i, hi_i):
/// u_j = (1/R)·Σ_{i : lo_i ≤ j < hi_i} 1/(hi_i − lo_i), over the R rows that see some key.
Vector uniform_key_share(const std::vector<KeyRange>& visible, std::int64_t nk);
/// The same for rows that see the keys 0..visible_i − 1 (a causal rule without a window).
Vector uniform_key_share(const std::vector<std::int64_t>& visible, std::int64_t nk);
/// Attention sinks: keys with key_share ≥ `threshold` (a tenth of all the head's attention by
/// default, so at most 10 sinks) and ≥ `factor` × uniform_key_share over the same visible keys
/// (4 by default: under a causal rule early keys get more attention even from uniform rows,
/// c_0 = H_N/N, which is 0.26 at N = 12 but 0.02 at N = 309; under a window of W keys a key gets
/// about 1/N from uniform rows, and the first W keys more). Ascending.
std::vector<std::int64_t> sink_columns(const Matrix& p, const std::vector<KeyRange>& visible,
                                       double threshold = 0.1, double factor = 4.0);
/// The same for rows that see the keys 0..visible_i − 1.
std::vector<std::int64_t> sink_columns(const Matrix& p, const std::vector<std::int64_t>& visible,
                                       double threshold = 0.1, double factor = 4.0);

/// The survey's Fig. 5 panel: the top-left size×size block of P (smaller if P is), each row
/// divided by its largest entry in the block (a zero row stays 0).
Matrix top_left_panel(const Matrix& p, std::int64_t size = 20);
/// A grid×grid summary of the whole of P: mean of P over each block of a grid×grid partition of
/// its rows and columns (block edges at floor(b·N/grid)); needs at least `grid` rows and columns.
Matrix block_panel(const Matrix& p, std::int64_t grid = 20);

// ---- one layer --------------------------------------------------------------------------------

/// One captured layer, float64, row-major [H, N, D] per tensor as `numattn capture` writes them:
/// q_* have `heads` query heads, k_* and v `kv_heads` (GQA: query head h reads KV head
/// h / (heads / kv_heads)). q_pre/k_pre may be empty (then no pre-RoPE spectra). `window`: the
/// layer's sliding window in keys (0 = none, a global layer), as the model's forward uses it.
struct LayerQkv {
  std::int64_t heads = 0, kv_heads = 0, n = 0, d = 0;
  std::int64_t window = 0;
  std::vector<double> q_pre, k_pre, q_post, k_post, v;
};

/// Spectrum of one matrix of one head.
struct HeadSpectrum {
  std::int64_t head = 0;  ///< query head (qk, a, p) or KV head (k_*, v)
  const char* matrix = "";  ///< q_pre, k_pre, q_post, k_post, v, qk, a, p, a_exp (= global_shift_a)
  Vector sigma;
  SpectrumStats stats;
};

/// Row statistics of one query head's P.
struct HeadRows {
  std::int64_t head = 0;
  double entropy_mean = 0, entropy_min = 0, entropy_max = 0;
  double topk_mass_k8 = 0, topk_mass_k32 = 0, topk_mass_frac10 = 0;  ///< means over rows
  std::vector<std::int64_t> sinks;
  Matrix panel;         ///< top_left_panel(P)
  Matrix block_grid;    ///< block_panel(P) (empty when N < 20)
  Vector sigma_a_global;  ///< σ(global_shift_a(S)), for the §9 findings
};

struct LayerAnalysis {
  std::vector<HeadSpectrum> spectra;  ///< per KV head: k_pre, k_post, v; per query head: q_pre,
                                      ///< q_post, qk, a, p, a_exp (the pre-RoPE ones only if given)
  std::vector<HeadRows> rows;         ///< per query head
  std::int64_t window = 0;            ///< LayerQkv::window
};

/// Analyses every query head in `heads` (all if empty; KV heads are those the chosen query heads
/// read) of one layer: the spectra, row statistics and panels above, parallel over heads on
/// `ctx`, with softmax scale `scale`. Visibility as the model: bottom-right causal (Nq = Nk) and
/// the layer's window `l.window`, which A, P, exp(S − max S)⊙M, the row statistics (top-k
/// budgets count the window's keys) and the sinks (uniform attention over the window's keys)
/// all honour; S and the spectra of Q, K, V do not depend on it. Throws numattn::Error for
/// inconsistent sizes, a negative window or a head out of range.
LayerAnalysis analyze_layer(const LayerQkv& l, double scale, const std::vector<std::int64_t>& heads,
                            const ExecContext& ctx);

/// The three qualitative findings of the survey's Llama 3.2 experiment, checked on `layers`
/// (N tokens, head dimension d) with fixed criteria, as a JSON list of {"id", "statement", "holds"
/// (true, false or "partly"), "criterion", "evidence": {numbers}}:
/// 1. "qk_low_rank": S = QKᵀ has numerical rank ≤ d < N (at 1e-10·σ₁) in every head, and Q, K
///    (post-RoPE) decay moderately: the median over heads of σ_d/σ₁ lies in [1e-3, 0.5]
///    (they decay, but stay within three orders of magnitude). Partly: the rank holds, the decay
///    criterion fails for Q or K.
/// 2. "a_strong_decay": A = exp(S)⊙M (global shift, the survey's matrix) decays strongly in
///    every head: at most N/4 singular values above 1e-2·σ₁. Partly: in at least half the heads.
/// 3. "p_weaker_than_a": P decays more weakly than A: the mean of log10(σ_k/σ₁) over k is larger
///    for P than for exp(S)⊙M, in at least 90% of the heads (partly: at least half).
/// The evidence also gives the numbers for the row-max-shifted A (the "a" of stats.csv). On
/// layers with a window, M is the causal rule and the window (the matrices the model computes);
/// findings 2 and 3 then add "heads_windowed", the heads of such layers among those counted.
nlohmann::ordered_json section9_findings(const std::vector<LayerAnalysis>& layers, std::int64_t n, std::int64_t d);

/// Mean of log10(σ_k/σ₁) over all k (a σ_k below 1e-300·σ₁ counts as that): the
/// geometric-mean height of the normalised spectrum, in decades (0 for a flat one).
double mean_log_decay(const Vector& sigma);

/// Copies query head h (Q) or KV head h (K, V) of an [H, N, D] array into an N×D matrix.
Matrix head_matrix(const std::vector<double>& hnd, std::int64_t h, std::int64_t n, std::int64_t d);

}  // namespace numattn::analysis
