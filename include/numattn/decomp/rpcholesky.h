/// @file rpcholesky.h
/// Randomly pivoted Cholesky (RPCholesky): a rank-r Nyström approximation
/// G ≈ F·Fᵀ of an n×n positive semidefinite matrix that reads only its diagonal and r of its
/// columns, choosing each pivot at random in proportion to the diagonal of the current residual.
///
/// Algorithm (Chen, Epperly, Tropp, Webber, "Randomly pivoted Cholesky: practical approximation
/// of a kernel matrix with few entry evaluations", CPAM 2024):
///
///     d = diag(G), F = []
///     repeat r times:  s ~ d / Σd;  g = G(:,s) − F·F(s,:)ᵀ;  F ← [F, g/√g_s];  d ← max(d − f∘f, 0)
///
/// The pivots are the coreset; `F·Fᵀ = G(:,S)·G(S,S)⁻¹·G(S,:)` (the Nyström approximation), and
/// `F(S,:)` (rows at the pivots, in pivot order) is lower triangular, so Nyström weights are one
/// triangular solve away (WILDCAT, lowrank.wildcat).
///
/// **Diagonally weighted form.** Kernels such as exp(c·kᵢ·kⱼ) overflow float64 long before they
/// stop being useful. The matrix to factor can be given as `D·G̃·D` with D = diag(exp(w/2)): G̃ is
/// read through the callbacks (e.g. the Gaussian kernel exp(−c‖kᵢ−kⱼ‖²/2), entries ≤ 1) and the
/// logs `w` set the sampling weights, pᵢ ∝ exp(wᵢ)·d̃ᵢ, evaluated relative to max w. The pivots
/// are then drawn from exactly the distribution of RPCholesky on D·G̃·D (its residual diagonal is
/// D²·d̃ at every step) and the returned factor is that of G̃: the factor of D·G̃·D is D·F.
///
/// Cost: (r+1)·n entry evaluations, O(r²·n) arithmetic, O(r·n) memory. Randomness: pivot t uses
/// `CounterRng(seed, stream).uniform(t)`, so the result is a pure function of (seed, stream).
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::decomp {

/// Writes column j of the PSD matrix G̃ (n doubles) to `col`.
using PsdColumnFn = std::function<void(index_t j, double* col)>;

struct RpCholeskyOptions {
  index_t rank = 0;                   ///< r: the most pivots to take (≥ 0)
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;           ///< e.g. the (batch, head) a factorisation belongs to
  /// Stop early once the (weighted) residual trace is at most `rel_tol` times the initial one,
  /// or the sampled pivot's residual is not positive: the matrix is exhausted to working
  /// precision, and further pivots would only divide by rounding noise.
  double rel_tol = 1e-12;
  /// Optional logs w of the diagonal weights (n entries; empty = G itself is factored).
  std::span<const double> log_weight;
};

struct RpCholeskyResult {
  std::vector<index_t> pivots;  ///< k ≤ r pivots, in the order chosen (distinct)
  Eigen::MatrixXd factor;       ///< n × k: G̃ ≈ F·Fᵀ, exact at the pivot rows and columns
  std::vector<double> residual_diag;  ///< n: diag(G̃ − F·Fᵀ), clamped at 0
  /// Traces of the weighted matrix D·G̃·D divided by exp(max w) (of G̃ without weights): at the
  /// start and after the last pivot. Their ratio is the relative trace error of the Nyström
  /// approximation, ‖G − F·Fᵀ‖_* / ‖G‖_*.
  double initial_trace = 0, residual_trace = 0;
  bool early_stop = false;  ///< fewer than `rank` pivots: the residual reached `rel_tol`
};

/// RPCholesky of the n×n PSD matrix with diagonal `diag` and columns `column` (see the file
/// comment). Throws `numattn::Error` for a negative or non-finite diagonal entry, a size
/// mismatch, or a negative rank. Never takes more than n pivots.
RpCholeskyResult rp_cholesky(index_t n, std::span<const double> diag, const PsdColumnFn& column,
                             const RpCholeskyOptions& opt);

}  // namespace numattn::decomp
