/// @file dense.h
/// Dense float64 factorisations (SVD, symmetric eigendecomposition, QR with and without column
/// pivoting, LU / Cholesky / least-squares solves) behind one small non-template API, computed
/// by the LAPACK that ships inside the linked OpenBLAS.
///
/// Why this file exists: Eigen's decompositions are header templates, and every translation unit
/// that instantiated one (BDCSVD, JacobiSVD, SelfAdjointEigenSolver, HouseholderQR,
/// ColPivHouseholderQR, PartialPivLU, LDLT...) paid 80–200 s of compile time under ASan. Here
/// they compile once, in src/decomp/dense.cpp; callers include only <Eigen/Core>. No other file
/// of the project includes <Eigen/Dense>, <Eigen/SVD>, <Eigen/QR>, <Eigen/Eigenvalues>,
/// <Eigen/LU> or <Eigen/Cholesky> (docs/design.md, "Compile time").
///
/// Conventions:
/// - Inputs are `Eigen::Ref<const Eigen::MatrixXd>`: any column-major double matrix or block binds
///   without a copy, and a row-major one (or an expression) is copied once into a temporary, so
///   `dense::svd(row_major)` and `dense::svd(b.transpose())` both work. LAPACK overwrites its
///   input, so one column-major copy is made inside anyway.
/// - Outputs are column-major `Eigen::MatrixXd` / `Eigen::VectorXd` (LAPACK's layout).
/// - Errors, Eigen style: nothing throws for bad *data*; every result carries `info`:
///   kInvalidInput for a NaN or ±inf entry (the outputs then have their normal shapes and are
///   filled with NaN, so the NaN still reaches whatever reads them), kNoConvergence when LAPACK
///   reports that an iteration failed, kNumericalIssue for an exactly singular (LU) or not
///   positive definite (Cholesky) matrix (outputs NaN-filled). A shape mismatch between
///   arguments is a programming error and throws numattn::Error.
/// - Empty inputs (0 rows or columns) are valid and give empty factors (k = 0) and kSuccess.
/// - Thread-safe; LAPACK runs single-threaded (blas::ensure_serial), numattn's own
///   `parallel_for` is the one level of parallelism.
///
/// Cost: the usual O(m·n·min(m, n)) of each factorisation. All results are deterministic and do
/// not depend on the calling thread.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <vector>

namespace numattn::decomp::dense {

using Matrix = Eigen::MatrixXd;  ///< column-major float64
using Vector = Eigen::VectorXd;
using ConstRef = Eigen::Ref<const Eigen::MatrixXd>;

/// Eigen's ComputationInfo.
enum class Info { kSuccess, kNumericalIssue, kNoConvergence, kInvalidInput };
const char* to_string(Info i);

/// Thin SVD A = U·diag(s)·Vᵀ of an m×n matrix, k = min(m, n): U m×k and Vᵀ k×n with orthonormal
/// columns / rows, s descending and ≥ 0. With `vectors = false` only s is computed (u and vt are
/// left empty).
/// - kDivideAndConquer: LAPACK dgesdd (dgesvd if it does not converge). The fast one; each σ is
///   accurate to about ε·σ_max.
/// - kJacobi: one-sided Jacobi, LAPACK dgesvj (as Eigen's JacobiSVD): several times slower, small
///   singular values to high relative accuracy. Also an independent second algorithm for tests.
///   Caveat (LAPACK's): the columns of U (of V for a wide A) that belong to σ = 0 (or underflowed)
///   are not computed, so U is orthonormal only on the nonzero singular values.
enum class SvdAlgorithm { kDivideAndConquer, kJacobi };
struct Svd {
  Matrix u;
  Vector s;
  Matrix vt;
  Info info = Info::kSuccess;
};
Svd svd(const ConstRef& a, bool vectors = true, SvdAlgorithm alg = SvdAlgorithm::kDivideAndConquer);

/// The singular values only (descending; NaN-filled for a non-finite input).
Vector singular_values(const ConstRef& a, SvdAlgorithm alg = SvdAlgorithm::kDivideAndConquer);
/// σ_max = ‖A‖₂ (0 for an empty matrix, NaN for a non-finite one).
double spectral_norm(const ConstRef& a, SvdAlgorithm alg = SvdAlgorithm::kDivideAndConquer);
/// σ_max / σ_min of an m×n block (min(m, n) values); +inf when σ_min = 0 or A is non-finite,
/// 1 for an empty block.
double condition_number(const ConstRef& a);

/// Moore–Penrose inverse (n×m) through the SVD: singular values at most rcond·σ_max count as 0
/// (rcond < 0: ε·max(m, n), Eigen's default). Non-finite A gives an all-NaN result.
Matrix pinv(const ConstRef& a, double rcond = -1);

/// Eigendecomposition A = V·diag(λ)·Vᵀ of a symmetric n×n matrix, read from its LOWER triangle
/// (as Eigen's SelfAdjointEigenSolver). λ ascending; V orthogonal, column i for λ_i (each
/// eigenvector's sign is LAPACK's, arbitrary). LAPACK dsyevd. `vectors = false`: values only.
struct SymEig {
  Vector values;
  Matrix vectors;
  Info info = Info::kSuccess;
};
SymEig sym_eig(const ConstRef& a, bool vectors = true);

/// Householder QR A = Q·R of an m×n matrix, thin: Q m×k (orthonormal columns), R k×n upper
/// trapezoidal, k = min(m, n). R's diagonal has LAPACK's (and Eigen's) signs: the factorisation
/// is unique once a caller flips columns of Q and rows of R to make diag(R) ≥ 0.
/// LAPACK dgeqrf + dorgqr; `want_q = false` skips Q.
struct Qr {
  Matrix q;
  Matrix r;
  Info info = Info::kSuccess;
};
Qr qr(const ConstRef& a, bool want_q = true);

/// Column-pivoted (rank-revealing) QR A·P = Q·R (LAPACK dgeqp3: Businger–Golub pivoting on the
/// largest remaining column norm, as Eigen's ColPivHouseholderQR). `perm[j]` is the column of A
/// placed at position j (so perm[0..r) are the r most independent columns). |R_ii| decreases
/// (up to rounding); `rank` = #{i : |R_ii| > threshold·max|R_ii|} with threshold < 0 meaning
/// ε·min(m, n) (Eigen's ColPivHouseholderQR::rank()). R is k×n (k = min(m, n)); Q (m×k) only
/// with `want_q`.
struct ColPivQr {
  Matrix q;
  Matrix r;
  std::vector<std::int64_t> perm;
  std::int64_t rank = 0;
  Info info = Info::kSuccess;
};
ColPivQr colpiv_qr(const ConstRef& a, double threshold = -1, bool want_q = false);

/// X with A·X = B for square A (n×n, B n×p): LU with partial pivoting (LAPACK dgesv). An
/// exactly singular A gives kNumericalIssue and an all-NaN X.
struct Solution {
  Matrix x;
  std::int64_t rank = 0;  ///< numerical rank used (lstsq only)
  Info info = Info::kSuccess;
};
Solution lu_solve(const ConstRef& a, const ConstRef& b);

/// X with A·X = B for symmetric positive definite A (lower triangle read): Cholesky (LAPACK
/// dpotrf + dpotrs). Not positive definite: kNumericalIssue, all-NaN X.
Solution cholesky_solve(const ConstRef& a, const ConstRef& b);

/// Least squares min ‖A·X − B‖_F for A m×n (B m×p) through column-pivoted QR: the basic
/// solution on the numerical rank (Eigen's ColPivHouseholderQR::solve): X has zeros at the
/// n − rank least independent columns. For full column rank this is THE least-squares solution
/// (m ≥ n) or a solution of the underdetermined system (m < n). `threshold` as in colpiv_qr.
Solution lstsq(const ConstRef& a, const ConstRef& b, double threshold = -1);

}  // namespace numattn::decomp::dense
