/// @file basis_decomposition.h
/// Basis Decomposition (BD) of a matrix of exact rank r, and of several matrices that share
/// one basis index set.
///
/// Row form (`BdForm::kRows`), W ∈ R^{m×n}: pick r row indices S with W[S,:] independent; then
///   B = W[S,:]                (r × n)
///   C = W[S^c,:] · B^+        ((m−r) × r), so that W[S^c,:] = C · B exactly when rank W = r.
/// Column form (`BdForm::kCols`): B = W[:,S] (m × r), C (r × (n−r)) with W[:,S^c] = B · C.
/// S is kept sorted ascending; S^c likewise, so rows of C follow the order of S^c.
///
/// Low-rank form (`compute_lowrank(U, V)`, W = U·V, U ∈ R^{m×r}, V ∈ R^{r×n}, W never formed):
///   row form  C = U[S^c,:] · U[S,:]^{-1},  B = U[S,:] · V;
///   column form C = V[:,S]^{-1} · V[:,S^c], B = U · V[:,S].
///
/// Numerics (docs/bd.md): everything is computed in float64 from a pivoted
/// factorisation (LU with partial pivoting for a square basis block, column-pivoted Householder
/// QR for the least-squares case n > r; LAPACK through decomp/dense.h). In exact arithmetic BD is lossless; in floating point its error
/// is amplified by κ = cond(basis block), so κ is reported per matrix and the basis index set
/// is chosen to keep the worst κ small:
///   - `first` / `last`: S = the first / last r indices (what the official code tries);
///   - `residual_min`: the better of first and last by mean relative residual (the paper's rule);
///   - `pivoted`: column-pivoted QR (the standard rank-revealing choice for one matrix; for
///     several matrices it pivots the stacked, Frobenius-normalised matrices);
///   - `maxmin`: a multi-matrix greedy rule: normalise each matrix, then r
///     times pick the index whose *smallest* residual norm across matrices is largest, and
///     project that direction out of every matrix (Gram–Schmidt). For one matrix it equals
///     column-pivoted QR.
///   - `automatic`: `pivoted` for one matrix, `maxmin` for several.
///
/// Cost: selection O(r·m·Σn_i) (maxmin, pivoted), solves O(r²·(m+n)) per matrix, κ via an SVD
/// of the basis block O(r²·n).
///
/// Errors (Eigen style): `compute*` never throws for bad data; `info()` says kInvalidInput
/// (shape/rank/non-finite input; `message()` names it) or kNumericalIssue (a basis block is
/// numerically singular, κ·eps64 ≥ 1, or a coefficient is not finite). Accessors throw
/// `numattn::Error` when nothing was computed.
///
/// Citation: J. Zhao, "Accelerating Attention with Basis Decomposition", arXiv 2510.01718.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::decomp {

/// Row-major float64 matrix: the layout of .npy files and of the rest of numattn.
using MatrixXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Eigen's ComputationInfo, restricted to what BD can report.
enum class ComputationInfo { kSuccess, kNumericalIssue, kInvalidInput };
const char* to_string(ComputationInfo i);

enum class BdForm { kRows, kCols };
/// "rows" | "cols" (also "row", "col", "columns"); throws numattn::Error otherwise.
BdForm parse_form(const std::string& s);
const char* to_string(BdForm f);

enum class BasisStrategy { kAutomatic, kFirst, kLast, kResidualMin, kPivoted, kMaxMin };
/// "auto" | "first" | "last" | "residual_min" | "pivoted" | "maxmin"; throws otherwise.
BasisStrategy parse_strategy(const std::string& s);
const char* to_string(BasisStrategy s);

/// Storage and multiply-accumulate counts of one m×n matrix of rank r, per input row x·W:
/// dense m·n, low-rank U·V r(m+n), BD r(m+n−r) (the identity block is free).
struct BdAccounting {
  std::int64_t params_dense = 0, params_lowrank = 0, params_bd = 0;
  std::int64_t macs_dense = 0, macs_lowrank = 0, macs_bd = 0;
};
BdAccounting bd_accounting(std::int64_t m, std::int64_t n, std::int64_t r);

/// Chooses r basis indices shared by all `mats`, in row form (rows of each matrix; every
/// matrix must have the same row count m). For the column form pass the transposes.
/// Returns S sorted ascending. `kAutomatic` resolves as documented above.
/// Throws numattn::Error on r out of [1, m] or mismatched row counts.
std::vector<index_t> select_rows(std::span<const MatrixXd> mats, index_t r, BasisStrategy s);

/// Condition number σ_max/σ_min of a (possibly rectangular) block; +inf when singular.
double condition_number(const MatrixXd& a);

class BasisDecomposition {
 public:
  BasisDecomposition() = default;

  /// Rank r ≥ 1. Overrides a tolerance.
  BasisDecomposition& set_rank(index_t r);
  /// Numerical rank from a tolerance instead of a fixed r: r = #{i : |R_ii| > tol·|R_00|} of a
  /// column-pivoted QR (maximum over the matrices). Ignored by compute_lowrank (r = U.cols()).
  /// tol must be finite and >= 0 (Error).
  BasisDecomposition& set_tolerance(double tol);
  BasisDecomposition& set_form(BdForm f);
  BasisDecomposition& set_strategy(BasisStrategy s);
  /// Forces a given basis (size r, any order, no repeats); the strategy is then ignored.
  BasisDecomposition& set_basis(std::vector<index_t> s);

  /// One dense matrix.
  BasisDecomposition& compute(const MatrixXd& w);
  /// Several matrices sharing one S (same m in row form, same n in column form).
  BasisDecomposition& compute(std::span<const MatrixXd> ws);
  /// W = U·V given by its factors (U m×r, V r×n), never formed.
  BasisDecomposition& compute_lowrank(const MatrixXd& u, const MatrixXd& v);
  /// Several factored matrices W_k = U_k·V_k sharing S.
  BasisDecomposition& compute_lowrank(std::span<const MatrixXd> us, std::span<const MatrixXd> vs);

  ComputationInfo info() const { return info_; }
  /// Why info() is not kSuccess (empty otherwise).
  const std::string& message() const { return message_; }

  /// Shape of matrix 0 (matrices sharing S may differ in the other dimension).
  index_t rows() const { return m_; }
  index_t cols() const { return n_; }
  index_t rank() const { return r_; }
  index_t matrices() const { return static_cast<index_t>(b_.size()); }
  BdForm form() const { return form_; }
  /// The strategy actually used (kAutomatic resolved).
  BasisStrategy strategy_used() const { return used_; }
  /// S, sorted ascending (row indices in row form, column indices in column form).
  const std::vector<index_t>& basis() const;
  /// S^c, sorted ascending.
  const std::vector<index_t>& complement() const;
  /// B of matrix k: r×n (row form) or m×r (column form).
  const MatrixXd& basis_block(index_t k = 0) const;
  /// C of matrix k: (m−r)×r (row form) or r×(n−r) (column form).
  const MatrixXd& coefficients(index_t k = 0) const;
  /// κ of matrix k's basis block: cond(W[S,:]) (dense row form), cond(W[:,S]) (dense column
  /// form), cond(U[S,:]) / cond(V[:,S]) (low-rank form: the r×r block that is inverted).
  double cond_basis(index_t k = 0) const;
  double cond_basis_max() const;
  /// ‖W − Ŵ‖_F / ‖W‖_F of matrix k in float64 (low-rank form: computed through V·Vᵀ or
  /// Uᵀ·U, so W is still never formed).
  double residual_rel(index_t k = 0) const;
  double residual_rel_max() const;
  /// Accounting of matrix 0.
  BdAccounting accounting() const { return bd_accounting(m_, n_, r_); }

  /// Ŵ_k = P·[I; C]·B (row form) or B·[I C]·P (column form), m×n. Costs (m−r)·r·n MACs.
  MatrixXd reconstruct(index_t k = 0) const;
  /// x·W_k through BD, x ∈ R^{t×m}: row form (x[:,S] + x[:,S^c]·C)·B; column form z = x·B,
  /// y[:,S] = z, y[:,S^c] = z·C. r(m+n−r) MACs per row instead of m·n.
  MatrixXd apply(const MatrixXd& x, index_t k = 0) const;

 private:
  void reset();
  void fail(ComputationInfo i, std::string msg);
  void check_computed() const;
  // Both forms reduce to the row form: the column form runs on transposes and transposes B
  // and C back. `vs` empty: dense matrices `as`; else factors W_k = as[k]·vs[k].
  void run_rows(std::span<const MatrixXd> as, std::span<const MatrixXd> vs, bool transposed);

  index_t rank_req_ = 0;
  double tol_ = -1;
  BdForm form_ = BdForm::kRows;
  BasisStrategy strategy_ = BasisStrategy::kAutomatic;
  std::vector<index_t> forced_;

  ComputationInfo info_ = ComputationInfo::kInvalidInput;
  std::string message_ = "nothing computed yet";
  bool computed_ = false;
  BasisStrategy used_ = BasisStrategy::kAutomatic;
  index_t m_ = 0, n_ = 0, r_ = 0;
  std::vector<index_t> s_, sc_;
  std::vector<MatrixXd> b_, c_;
  std::vector<double> kappa_, resid_;
  std::vector<index_t> mk_, nk_;  ///< shape of each matrix
};

}  // namespace numattn::decomp
