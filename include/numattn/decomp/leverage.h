/// @file leverage.h
/// Leverage scores of the rows of a tall matrix (as LevAttention uses them: Kannan,
/// Bhattacharyya, Kacham, Woodruff, ICLR 2025).
///
/// For A (n×d) with thin SVD A = U·Σ·Vᵀ truncated to its numerical rank ρ, the leverage score of
/// row j is ℓⱼ = ‖U(j,:)‖² = aⱼ·(AᵀA)⁺·aⱼᵀ: the largest share of ‖A·x‖² row j can hold, over all
/// x. Each lies in [0, 1] and they sum to ρ = rank(A) ≤ d.
///
/// Well-conditioned A (κ(A) ≤ 1e4, n ≥ d; the usual case for attention keys): G = AᵀA = VΛVᵀ by
/// one BLAS-3 product and ℓⱼ = ‖aⱼ·V·Λ^{-1/2}‖², accurate to about ε₆₄·κ² ≤ 1e-8. Otherwise
/// (ill-conditioned or rank-deficient) without forming AᵀA, which would square the condition
/// number: a Householder QR A = Q·R, the SVD R = U_R·Σ·Vᵀ, ρ = #{σ > tol·σ_max}, and
/// ℓⱼ = ‖aⱼ·V_ρ·Σ_ρ⁻¹‖². Cost O(n·d²) time, O(n·d) memory, float64 throughout.
///
/// Online (streaming) scores: ℓⱼ^on = aⱼ·(A_{≤j}ᵀA_{≤j} + λI)⁻¹·aⱼᵀ, row j scored against the
/// rows up to and including itself (Cohen, Musco, Pachocki, "Online row sampling", APPROX 2016).
/// They upper-bound the score of row j in every longer prefix (adding rows only lowers
/// leverage) and sum to O(d·log(‖A‖²/λ)). Kept as the Cholesky factor of AᵀA + λI, updated by
/// one rank-one (Givens) update per row: O(n·d²) time, O(d²) memory.
#pragma once

#include <span>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::decomp {

struct LeverageScores {
  std::vector<double> scores;  ///< n scores in [0, 1]
  index_t rank = 0;            ///< ρ, the numerical rank used; Σ scores = ρ up to rounding
};

/// Leverage scores of the rows of the row-major n×d matrix `a` (row stride `lda` ≥ d).
/// `rank_tol` < 0 selects the default tolerance max(n, d)·ε₆₄ relative to σ_max (as
/// numpy.linalg.matrix_rank). A zero matrix has rank 0 and all scores 0. Throws
/// `numattn::Error` for non-finite entries.
LeverageScores leverage_scores(const double* a, index_t n, index_t d, index_t lda,
                               double rank_tol = -1);

/// Online leverage scores (see the file comment) with ridge `lambda` > 0, rows in order.
/// Throws `numattn::Error` for `lambda` ≤ 0 or non-finite entries.
std::vector<double> online_leverage_scores(const double* a, index_t n, index_t d, index_t lda,
                                           double lambda);

}  // namespace numattn::decomp
