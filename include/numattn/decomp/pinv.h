/// @file pinv.h
/// Pseudo-inverses of small dense matrices: the Newton–Schulz-type iteration of Nyströmformer and
/// Skyformer, and the exact Moore–Penrose inverse through an SVD.
///
/// **Iteration** (Razavi et al. 2014, as used by Xiong et al., Nyströmformer, AAAI 2021, and
/// Chen et al., Skyformer, NeurIPS 2021), for C ∈ R^{m×n}:
///
///     Z₀ = Cᵀ / (‖C‖₁ ‖C‖∞)
///     Z  ← ¼ Z (13 I − C Z (15 I − C Z (7 I − C Z)))          (4 products of m×m or m×n size)
///
/// On each singular direction x = σ²·z (an eigenvalue of CZ) the update is
/// 1 − x' = ¼ (1 − x)³ (4 − x): with the scaling of Z₀, every x starts in (0, 1] (σ²/(‖C‖₁‖C‖∞)
/// ≤ σ²/σ_max² ≤ 1), and stays there, so Z converges to the Moore–Penrose inverse C⁺ for any C
/// (Z stays in the range of Cᵀ, so null-space directions never enter); once 1 − x is small the
/// convergence is of order 3. A small x grows only by about 13/4 per step, so a direction with
/// σ²/(‖C‖₁‖C‖∞) ≪ (4/13)^iters is still damped after `iters` steps: with 6 iterations (the
/// papers' default) an ill-conditioned C gets a regularised inverse, not C⁺. The object reports
/// that outcome (Eigen style): `residual()` = ‖I − CZ‖_F (for m ≤ n; ‖I − ZC‖_F for m > n),
/// `info()` = kSuccess when it is at most `tolerance`, kNoConvergence otherwise. A rank-deficient
/// C never reaches a one-sided inverse, so it reports kNoConvergence even though Z → C⁺.
///
/// For a row-stochastic C (Nyströmformer's softmax kernel F₂), ‖C‖∞ = 1 and Z₀ = Cᵀ/‖C‖₁ =
/// Cᵀ / max column sum, the corrected initialisation of the official code (its README notes the
/// original Z₀ had a scale error).
///
/// Cost: 4·iters matrix products, about 8·iters·m²·n flops (m ≤ n), in `Scalar` (float or double).
/// Non-finite entries of C give a non-finite Z and residual (kNumericalIssue).
#pragma once

#include <Eigen/Core>

namespace numattn::decomp {

/// Outcome of an iterative computation (Eigen's ComputationInfo, narrowed to what happens here).
enum class PinvInfo { kSuccess, kNoConvergence, kNumericalIssue };
const char* to_string(PinvInfo i);

template <typename Scalar>
class NewtonSchulzPinv {
 public:
  using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// Default tolerance on ‖I − CZ‖_F: 1e-3 (float), 1e-8 (double).
  static constexpr double default_tolerance() { return sizeof(Scalar) == 4 ? 1e-3 : 1e-8; }

  explicit NewtonSchulzPinv(int iterations = 6, double tolerance = default_tolerance())
      : iterations_(iterations), tolerance_(tolerance) {}

  /// Runs `iterations` steps on C (m×n, m, n ≥ 1). Never throws for bad data (see `info`).
  NewtonSchulzPinv& compute(const Eigen::Ref<const Matrix>& c);

  /// Z (n×m) after the last step.
  const Matrix& pinv() const { return z_; }
  /// ‖I − CZ‖_F (m ≤ n) or ‖I − ZC‖_F (m > n), after the last step / before the first.
  double residual() const { return residual_; }
  double initial_residual() const { return initial_residual_; }
  int iterations() const { return iterations_; }
  double tolerance() const { return tolerance_; }
  PinvInfo info() const { return info_; }

 private:
  double one_sided_residual(const Matrix& c) const;

  int iterations_;
  double tolerance_;
  Matrix z_;
  double residual_ = 0, initial_residual_ = 0;
  PinvInfo info_ = PinvInfo::kSuccess;
};

extern template class NewtonSchulzPinv<float>;
extern template class NewtonSchulzPinv<double>;

/// Moore–Penrose inverse of C (m×n) in float64 through a divide-and-conquer SVD (dense::pinv,
/// LAPACK dgesdd): singular values at most `rcond`·σ_max are treated as zero (rcond < 0: Eigen's
/// default, ε·max(m, n)). Cost O(m·n·min(m, n)). Non-finite C gives an all-NaN result.
Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> pinv_svd(
    const Eigen::Ref<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>& c,
    double rcond = -1);

}  // namespace numattn::decomp
